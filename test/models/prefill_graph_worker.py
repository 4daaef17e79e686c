"""Capture the language model the way SGLang's prefill graph runner does, replay it on CPU; print JSON.

    python test/models/prefill_graph_worker.py MODEL_DIR

Run as its own process (an in-process SGLang ModelRunner publishes process-wide state).
The model is built by SGLang's own loader (as `sglang.benchmark.one_batch` builds it,
through `sglang_evs.bench.inprocess`), with the plugin loaded. Capture follows `PrefillCudaGraphRunner`:
  - the body is `_resolve_transformer_layer_model(model).forward`, called with the
    runner's own `_get_layer_model_positions` and `_build_layer_model_forward_kwargs`
    on a fresh text-only extend batch whose `input_embeds` is the static slot;
  - two warm-up calls, then one recorded by `CpuGraph` (the CUDA graph's stand-in).
Capture is at a graph bucket (`CAPTURE_TOKENS`) larger than the live batches (`NUM_TOKENS`), so
every replay has padding rows, as a real one does. Replay follows the full backend, the stricter
of the two: the outer forward's work (here the model's `post_process` and the scatter of the main
channels, as the embedding routine does it) runs eagerly on a *different*, live batch, the live
embeddings are copied into the static slot (its padding rows zeroed), and the recording replays.
No Python of the model runs.
Each scenario's replayed hidden states are compared with an eager forward of the same
inputs, and with eager forwards missing what the scenario is about.
"""

import json
import sys
from types import SimpleNamespace

import torch

from sglang_evs.testing.cpu_graph import CpuGraph

NUM_TOKENS = 40  # a live batch
CAPTURE_TOKENS = 64  # the graph bucket it is padded to
GRAPH_BUCKETS = [64, 768]  # the largest above max_prefill_tokens: the buffers must cover it


def load_runner(model_dir: str):
    from sglang.srt.plugins import load_plugins

    from sglang_evs.bench import inprocess

    load_plugins()
    args = inprocess.cpu_server_args(model_dir, max_total_tokens=4096, chunked_prefill_size=256,
                                     max_prefill_tokens=512, cuda_graph_bs_prefill=GRAPH_BUCKETS)  # fmt: skip
    runner, _ = inprocess.load_runner(args)
    return runner


def extend_batch(runner, token_ids: list[int]):
    """A fresh one-request extend ForwardBatch, built through SGLang's scheduling path."""
    from sglang_evs.bench import inprocess

    return inprocess.extend_batch(runner, inprocess.schedule_batch(runner, [inprocess.new_request("r", token_ids)]))


class Harness:
    def __init__(self, runner) -> None:
        from sglang.srt.model_executor.runner import prefill_cuda_graph_runner as pcg

        self.runner = runner
        self.model = runner.model
        self.body = pcg._resolve_transformer_layer_model(self.model)
        self.pcg = pcg
        self.hidden = self.model.config.hidden_size
        self.token_ids = [7 + (i * 13) % 300 for i in range(CAPTURE_TOKENS)]

    def context(self, forward_batch):
        from contextlib import ExitStack

        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
        from sglang.srt.model_executor.runner_utils.forward_batch import set_forward_batch

        stack = ExitStack()
        stack.enter_context(set_forward_batch(forward_batch))
        stack.enter_context(
            forward_context(ForwardContext(attn_backend=self.runner.attn_backend), forward_batch=forward_batch)
        )
        return stack

    def capture(self) -> None:
        batch = extend_batch(self.runner, self.token_ids)
        batch.input_embeds = torch.zeros(CAPTURE_TOKENS, self.hidden)  # the runner's static slot
        runner_view = SimpleNamespace(enable_cp_bcg_capture=False, model_runner=self.runner)
        positions = self.pcg.PrefillCudaGraphRunner._get_layer_model_positions(runner_view, batch)
        kwargs = self.pcg._build_layer_model_forward_kwargs(self.body, batch, None)
        self.graph = CpuGraph()
        with torch.no_grad(), self.context(batch):
            for _ in range(2):  # the runner's warm-up
                self.body.forward(batch.input_ids, positions, batch, **kwargs)
            with self.graph:
                self.static_out = self.body.forward(batch.input_ids, positions, batch, **kwargs)
        self.static_embeds = batch.input_embeds

    def routine_tail(self, batch, text_embeds, fetched, requests):
        """What the embedding routine does after fetching features: post_process, then scatter."""
        from sglang_evs import sglang_compat
        from sglang_evs.multimodal.contract import BatchLayout

        fetched = self.model.post_process(fetched, BatchLayout(batch, batch.input_ids, requests))
        embeds = text_embeds.clone()
        for item in fetched:
            sglang_compat.scatter_mm_embedding(dest=embeds, mask=item.mask, src=item.embedding)
        return embeds

    def replayed(self, positions, text_embeds, fetched, requests) -> torch.Tensor:
        """The live batch's rows of a replay (the causal graph's first NUM_TOKENS rows see no padding)."""
        batch = extend_batch(self.runner, self.token_ids[:NUM_TOKENS])  # the live batch: its own tensors
        batch.mrope_positions = positions.clone()
        with torch.no_grad():
            embeds = self.routine_tail(batch, text_embeds, fetched, requests)
            self.static_embeds.zero_()
            self.static_embeds[:NUM_TOKENS].copy_(embeds)
            self.graph.replay()
        return self.static_out[:NUM_TOKENS].clone()

    def eager(self, positions, text_embeds, fetched, requests) -> torch.Tensor:
        batch = extend_batch(self.runner, self.token_ids[:NUM_TOKENS])
        batch.mrope_positions = positions.clone()
        with torch.no_grad(), self.context(batch):
            embeds = self.routine_tail(batch, text_embeds, fetched, requests)
            return self.body.forward(None, batch.mrope_positions, batch, input_embeds=embeds).clone()


def fetched_image(harness, rows: slice, seed: int, deepstack_scale: float = 1.0):
    from sglang_evs import sglang_compat
    from sglang_evs.multimodal.contract import FetchedEmbedding

    generator = torch.Generator().manual_seed(seed)
    levels = harness.model.num_deepstack_embeddings
    count = rows.stop - rows.start
    embedding = torch.randn(count, harness.hidden * (1 + levels), generator=generator)
    embedding[:, harness.hidden :] *= deepstack_scale
    mask = torch.zeros(NUM_TOKENS, 1, dtype=torch.bool)
    mask[rows] = True
    return [FetchedEmbedding(sglang_compat.Modality.IMAGE, embedding, mask)]


def text_positions(offset: int = 0) -> torch.Tensor:
    return (torch.arange(NUM_TOKENS) + offset).expand(3, NUM_TOKENS).clone()


def irregular_positions(seed: int) -> torch.Tensor:
    """Increasing positions with uneven gaps, different in each M-RoPE row (RoPE is relative:
    a uniform shift would change nothing)."""
    gaps = torch.randint(1, 6, (3, NUM_TOKENS), generator=torch.Generator().manual_seed(seed))
    return gaps.cumsum(dim=1)


def pruned_video_request(harness, seed: int):
    """A request whose pruned video region starts before this chunk and ends inside it.

    Returns (mm_inputs, prefix, extend) and the region's reference positions for the chunk,
    computed here from the rule: the unpruned region's positions with the pruned pads' rows
    deleted, then the chunk's window.
    """
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs

    from sglang_evs.pruning.fields import RATE, REGION_IDS, REGION_POSITIONS

    generator = torch.Generator().manual_seed(seed)
    video_token = harness.model.pruned_videos.video_token_id
    # Two groups of 2x3 pads, each behind 2 framing tokens: [f f p p p p p p] x 2.
    group = [11, 12] + [video_token] * 6
    region_ids = torch.tensor(group * 2)
    base = 100
    unpruned = []
    for g in range(2):
        start = base + g * 10
        unpruned += [(start, start, start), (start + 1, start + 1, start + 1)]
        unpruned += [(start + 2, start + 2 + r, start + 2 + c) for r in range(2) for c in range(3)]
    unpruned = torch.tensor(unpruned).T  # [3, 16]
    pad_mask = torch.rand(12, generator=generator) < 0.5
    pad_mask[:6] = True  # group 0 whole, as EVS keeps it
    keep = torch.ones(16, dtype=torch.bool)
    keep[region_ids == video_token] = pad_mask
    region_positions = unpruned[:, keep]
    region_start = 5  # request tokens [5, 5 + len) are the pruned region
    item = MultimodalDataItem(modality=Modality.VIDEO, offsets=[(region_start, region_start + int(keep.sum()) - 1)])
    item.hash = 4242 + seed
    item.model_specific_data = {RATE: 0.5, REGION_IDS: region_ids, REGION_POSITIONS: unpruned}
    harness.model.pruned_videos.masks[item.hash] = pad_mask
    prefix = 9  # the chunk starts 4 tokens into the region
    return MultimodalInputs(mm_items=[item]), prefix, region_start, region_positions


def main() -> None:
    from sglang_evs import sglang_compat

    harness = Harness(load_runner(sys.argv[1]))
    graph_inputs = getattr(harness.body, "graph_inputs", None)
    constructed = None if graph_inputs is None else graph_inputs.deepstack.data_ptr()
    harness.capture()
    report = {
        "body": type(harness.body).__name__,
        "recorded_ops": len(harness.graph.ops),
        "deepstack_ptr_constructed": constructed,
        "capacity": None if graph_inputs is None else graph_inputs.capacity,
        "graph_buckets": list(sglang_compat.prefill_limits().graph_buckets),
        "graph_reads_deepstack_buffer": None if graph_inputs is None else harness.graph.reads(graph_inputs.deepstack),
        "graph_reads_positions_buffer": None if graph_inputs is None else harness.graph.reads(graph_inputs.positions),
        # SGLang's warm-up of the `input_deepstack_embeds` argument branch: it checks the body's
        # signature first and must find nothing to warm (it would need a runner past that check).
        "deepstack_argument_warmup_ran": harness.pcg.PrefillCudaGraphRunner.run_dummy_multimodal_deepstack_forward(
            SimpleNamespace(), harness.body, 16
        ),
    }
    text = torch.randn(NUM_TOKENS, harness.hidden, generator=torch.Generator().manual_seed(1))
    no_media = [(None, 0, NUM_TOKENS)]
    text_only_reference = harness.eager(text_positions(), text, [], no_media)  # before any media was seen

    # 1. Deepstack: an image's rows with their deepstack channels, on a live batch.
    image = fetched_image(harness, slice(6, 30), seed=2)
    no_deepstack = fetched_image(harness, slice(6, 30), seed=2, deepstack_scale=0.0)
    replayed = harness.replayed(text_positions(), text, image, no_media)
    eager = harness.eager(text_positions(), text, image, no_media)
    eager_zero_deepstack = harness.eager(text_positions(), text, no_deepstack, no_media)
    report["deepstack"] = {
        "replay_vs_eager": (replayed - eager).abs().max().item(),
        "eager_vs_zero_deepstack": (eager - eager_zero_deepstack).abs().max().item(),
        "replay_vs_zero_deepstack": (replayed - eager_zero_deepstack).abs().max().item(),
    }
    if graph_inputs is not None:
        report["deepstack_ptr_after_forwards"] = graph_inputs.deepstack.data_ptr()

    # 2. A text-only prefill right after an image's replay: the graph must add zeros, not the image's
    # rows, which the buffer holds at that moment.
    harness.replayed(text_positions(), text, image, no_media)
    stale_rows = None if graph_inputs is None else int(graph_inputs.deepstack.abs().sum(dim=1).gt(0).sum())
    replayed = harness.replayed(text_positions(), text, [], no_media)
    report["text_after_image"] = {
        "deepstack_rows_before": stale_rows,
        "replay_vs_fresh_text_reference": (replayed - text_only_reference).abs().max().item(),
    }

    # 3. Positions the live batch carries (not the capture batch's).
    replayed = harness.replayed(irregular_positions(4), text, [], no_media)
    eager = harness.eager(irregular_positions(4), text, [], no_media)
    eager_capture_positions = harness.eager(text_positions(), text, [], no_media)
    report["live_positions"] = {
        "replay_vs_eager": (replayed - eager).abs().max().item(),
        "eager_vs_capture_positions": (eager - eager_capture_positions).abs().max().item(),
    }

    # 4. Pruned positions: a chunk that cuts a pruned video, then a second request in the batch.
    mm_inputs, prefix, region_start, region_positions = pruned_video_request(harness, seed=3)
    first_extend = 20
    requests = [(mm_inputs, prefix, first_extend), (None, 0, NUM_TOKENS - first_extend)]
    live = text_positions(500)
    reference = live.clone()  # what post_process must write: the rule, computed here
    window = region_positions[:, prefix - region_start : prefix - region_start + first_extend]
    reference[:, : window.shape[1]] = window
    replayed = harness.replayed(live, text, [], requests)
    written = None if graph_inputs is None else graph_inputs.positions[:, :NUM_TOKENS]
    buffer_equals_reference = None if written is None else torch.equal(written, reference)
    explicit = harness.eager(reference, text, [], no_media)  # the reference positions, handed in directly
    unrewritten = harness.eager(live, text, [], no_media)
    report["pruned_positions"] = {
        "region_rows_in_chunk": int(window.shape[1]),
        "replay_vs_eager_reference": (replayed - explicit).abs().max().item(),
        "reference_vs_unrewritten": (explicit - unrewritten).abs().max().item(),
        "buffer_equals_reference": buffer_equals_reference,
    }
    if graph_inputs is not None:
        report["deepstack_ptr_final"] = graph_inputs.deepstack.data_ptr()
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main()
