"""SGLang's own prefill graph runner on CPU, around one of our models: capture, replay live batches, print JSON.

    python test/models/prefill_graph_worker.py MODEL_DIR

Run as its own process (an in-process SGLang ModelRunner publishes process-wide state).

What runs is SGLang's, with the plugin loaded: its loader builds the model (as
`sglang.benchmark.one_batch` does, through `sglang_evs.bench.inprocess`);
`ModelRunner.init_prefill_cuda_graph` builds `PrefillCudaGraphRunner` with the breakable backend
and captures the buckets in `BUCKETS`; every live batch goes through `ModelRunner.forward`:
`can_run_graph`, `execute`, `load_batch` (which pads the batch to its bucket), the eager outer
forward (`AdaptedModel.forward`, the embedding routine, `post_process`) and the replay of the
captured segments, with attention running between them on the live batch's metadata. The one
thing replaced is `torch.cuda.CUDAGraph`, by `CpuGraphSegment` (`sglang_evs.runtime.cpu_graph`):
a segment replays its recorded kernels on the tensors it touched at capture, as a CUDA graph does.

The reference does not use the plugin's buffers: upstream SGLang's own model class, holding the
very same parameters, run eagerly with upstream's own embedding routine on a fresh copy of the
same batch. At q = 0 a replay must equal it bit for bit.
  mixed             one batch of an image, a text and a video request (three requests' attention
                    in one replay; 339 tokens padded to the 384 bucket; deepstack and M-RoPE rows);
  text_after_media  a text-only batch right after it, while the deepstack buffer holds media rows;
  pruned_chunks     a video at q = .75 prefilled in two chunks cut inside the pruned video: each
                    chunk's replay equals our eager forward of it (graph runner off).
Then, patched in this process, two broken copies of the plugin must fail the same comparisons:
`post_process` with its buffer writes removed, and buffers whose deepstack rows survive a forward; and a
capture whose body reads a value back to Python must fail, as a CUDA capture does.

The model is Qwen3-VL (deepstack and M-RoPE buffers) or GLM-4.1V (M-RoPE only, GLM's own processor and
prompts, `Family` below); for a model without deepstack the deepstack entries are left out of the report.
"""

import json
import sys
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch

BUCKETS = [32, 64, 128, 256, 384, 768]  # 768 is above the prefill budget (512): the buffers must cover it
VIDEO_PRUNING_RATE = 0.75


def load_runner(model_dir: str):
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import get_exec

    from sglang_evs.bench import inprocess
    from sglang_evs.runtime import bootstrap
    from sglang_evs.runtime.cpu_graph import stand_in_for_cuda_graphs

    bootstrap.install()
    stand_in_for_cuda_graphs()
    load_plugins()
    args = inprocess.cpu_server_args(model_dir, max_total_tokens=4096, chunked_prefill_size=256,
                                     max_prefill_tokens=512, cuda_graph_bs_prefill=BUCKETS)  # fmt: skip
    runner, tokenizer = inprocess.load_runner(args)
    # SGLang resolves the prefill graph backend to "disabled" for the torch-native attention
    # backend; the breakable backend is what a GPU server of this model uses, so it is set here.
    prefill = get_exec().graph.cuda_graph_config.prefill
    prefill.backend, prefill.bs = Backend.BREAKABLE, BUCKETS
    runner.init_prefill_cuda_graph()
    return runner, tokenizer, args


def upstream_twin(model):
    """Upstream SGLang's class of `model`, holding `model`'s parameter and buffer tensors."""
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    upstream_cls = next(cls for cls in type(model).__mro__ if cls.__module__.startswith("sglang.srt.models."))
    with set_default_torch_dtype(torch.float32), torch.device("cpu"):
        twin = upstream_cls(config=model.config, quant_config=None)
    ours = dict(model.named_modules())
    for name, module in twin.named_modules():
        module._parameters.update(ours[name]._parameters)
        module._buffers.update(ours[name]._buffers)
    return twin.eval()


class Harness:
    def __init__(self, model_dir: str) -> None:
        from sglang_evs.bench import inprocess

        self.runner, self.tokenizer, args = load_runner(model_dir)
        self.graph_runner = self.runner.prefill_cuda_graph_runner
        self.model = self.runner.model
        self.twin = upstream_twin(self.model)
        self.processor = inprocess.media_processor(self.runner, args)
        self.media = Path(tempfile.mkdtemp())

    def request(self, rid: str, prompt: str, **media):
        from sglang_evs.bench import inprocess

        return inprocess.make_request(self.runner, self.processor, self.tokenizer, rid, prompt, **media)

    def scenario(self, name: str, reqs: list):
        from sglang_evs.bench import inprocess

        batch = inprocess.extend_batch(self.runner, inprocess.schedule_batch(self.runner, reqs))
        return inprocess.Scenario.record(name, batch)

    def forward(self, scenario, graph: bool) -> tuple[torch.Tensor, bool]:
        """Next-token logits of `ModelRunner.forward` on a fresh copy, and whether a graph replayed."""
        from sglang.srt.managers import mm_schedule

        self.runner.prefill_cuda_graph_runner = self.graph_runner if graph else self.runner.eager_runner
        mm_schedule.embedding_cache.clear()
        with torch.no_grad():
            out = self.runner.forward(scenario.fresh())
        return out.logits_output.next_token_logits.clone(), bool(out.can_run_graph)

    def upstream(self, scenario) -> torch.Tensor:
        from sglang_evs.bench import inprocess

        return inprocess.timed_forward(self.runner, self.twin, scenario)[1].clone()

    def replay_vs_upstream(self, scenario) -> dict:
        replayed, on_graph = self.forward(scenario, graph=True)
        return {"replayed": on_graph, "tokens": scenario.tokens, "requests": int(scenario.batch.batch_size),
                "replay_vs_upstream": (replayed - self.upstream(scenario)).abs().max().item()}  # fmt: skip


class Family(NamedTuple):
    """How the model's prompts are written and how large its media are (enough tokens to cut a video)."""

    prompt: Callable[..., str]
    image: str
    video: str
    side: int  # pixels of the test image and clip
    pruned_frames: int  # frames of the pruned clip: at q = .75 its kept tokens reach beyond group 0


def family_of(model) -> Family:
    from sglang_evs.testing import requests

    if model.config.architectures[0].startswith("Glm4v"):
        return Family(requests.glm4v_chat_prompt, requests.GLM4V_IMAGE, requests.GLM4V_VIDEO, 112, 24)
    return Family(requests.chat_prompt, requests.IMAGE, requests.VIDEO, 64, 8)


def nonzero_rows(tensor: torch.Tensor) -> int:
    return int(tensor.abs().sum(dim=1).gt(0).sum())


def pruned_chunks(harness: Harness, family: Family) -> dict:
    """A video at q = .75 prefilled in two chunks, the cut inside its pruned region."""
    from sglang_evs.testing.media import write_clip

    side = family.side
    frames = family.pruned_frames
    video = write_clip(harness.media / "pruned.mp4", "moving", fps=4, num_frames=frames, height=side, width=side)
    req = harness.request("pruned", family.prompt(family.video, text="What moves?"), videos=[video],
                          processor_kwargs={"video_pruning_rate": VIDEO_PRUNING_RATE})  # fmt: skip
    offsets, total = req.multimodal_inputs.mm_items[0].offsets, req.extend_end
    start, end = offsets[0][0], offsets[-1][1]  # the pruned region: first pad to last
    cut = (start + end) // 2
    chunks = []
    for prefix, extend_end in ((0, cut), (cut, total)):
        req.prefix_len, req.extend_end = prefix, extend_end
        scenario = harness.scenario(f"chunk{len(chunks)}", [req])
        eager, _ = harness.forward(scenario, graph=False)
        replayed, on_graph = harness.forward(scenario, graph=True)  # the next chunk attends to this KV
        chunks.append({"tokens": scenario.tokens, "replayed": on_graph,
                       "replay_vs_eager": (replayed - eager).abs().max().item()})  # fmt: skip
    unpruned = harness.request("unpruned", family.prompt(family.video, text="What moves?"), videos=[video])
    return {"chunks": chunks, "cut_inside_region": start < cut < end, "tokens": total,
            "unpruned_tokens": unpruned.extend_end}  # fmt: skip


@contextmanager
def patched(module, name: str, value):
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


def post_process_without_writes(model, fetched, layout):
    """A broken `post_process`: the batch carries the buffers' views, but nothing is written to them."""
    from sglang_evs.models.graph_inputs import CARRIED_FIELD

    setattr(layout.forward_batch, CARRIED_FIELD, model.model.graph_inputs.view(layout.num_tokens))
    hidden = model.config.hidden_size
    return [replace(item, embedding=item.embedding[:, :hidden]) for item in fetched]


def write_keeping_deepstack(graph_inputs, num_tokens: int, positions):
    """Broken buffers: positions are written, deepstack rows of earlier forwards stay."""
    if graph_inputs.positions is not None:
        graph_inputs.positions[:, :num_tokens].copy_(positions)
    return graph_inputs.view(num_tokens)


def main() -> None:
    from sglang_evs.models import adapter
    from sglang_evs.models.graph_inputs import GraphInputs
    from sglang_evs.testing.media import write_clip, write_image

    harness = Harness(sys.argv[1])
    graph_runner, buffers = harness.graph_runner, harness.model.model.graph_inputs
    family, deepstack = family_of(harness.model), buffers.deepstack is not None
    constructed = buffers.deepstack.data_ptr() if deepstack else None
    side, prompt = family.side, family.prompt
    image = write_image(harness.media / "image.png", side, side)
    video = write_clip(harness.media / "clip.mp4", "moving", fps=4, num_frames=8, height=side, width=side)
    mixed = harness.scenario("mixed", [
        harness.request("image", prompt(family.image, text="What is it?"), images=[image]),
        harness.request("text", prompt(text="Count to five.")),
        harness.request("video", prompt(family.video, text="What moves?"), videos=[video]),
    ])  # fmt: skip
    text = harness.scenario("text", [harness.request("text2", prompt(text="Name three colours."))])

    segments = [seg for graph in graph_runner.backend._graphs.values() for seg in graph._segments]
    report = {
        "model": type(harness.model).__name__,
        "runner": type(graph_runner).__name__,
        "backend": type(graph_runner.backend).__name__,
        "buckets": sorted(graph_runner.capture_num_tokens),
        "capacity": buffers.capacity,
        "segments": len(segments),
        "graph_reads_positions_buffer": any(seg.graph.reads(buffers.positions) for seg in segments),
    }
    report["mixed"] = harness.replay_vs_upstream(mixed)
    stale = {}
    if deepstack:
        report["graph_reads_deepstack_buffer"] = any(seg.graph.reads(buffers.deepstack) for seg in segments)
        report["mixed"]["deepstack_rows"] = stale["stale_rows_before"] = nonzero_rows(buffers.deepstack)
    report["text_after_media"] = {**stale, **harness.replay_vs_upstream(text)}
    report["pruned"] = pruned_chunks(harness, family)
    if deepstack:
        report["deepstack_ptr"] = {"constructed": constructed, "final": buffers.deepstack.data_ptr()}

    # The buffers now hold the last chunk's rows: a replay that does not rewrite them reads those.
    with patched(adapter, "fill_graph_inputs", post_process_without_writes):
        report["broken"] = {"without_buffer_writes": harness.replay_vs_upstream(mixed)}
    if deepstack:
        with patched(GraphInputs, "write", write_keeping_deepstack):
            harness.forward(mixed, graph=True)
            report["broken"]["stale_deepstack"] = harness.replay_vs_upstream(text)
    report["planted_read_back"] = capture_with_a_read_back(harness)
    print("REPORT " + json.dumps(report))


def capture_with_a_read_back(harness: "Harness") -> str:
    """SGLang's runner captures again, a first decoder layer reading its output back to Python (`float()`,
    an `.item()`): the capture must fail as on a GPU. What it raised, or "" if it did not."""
    layer = type(harness.model.model.layers[0])
    upstream_forward = layer.forward

    def forward_reading_back(self, *args, **kwargs):
        out = upstream_forward(self, *args, **kwargs)
        float((out[0] if isinstance(out, tuple) else out).sum())
        return out

    with patched(layer, "forward", forward_reading_back):
        try:
            harness.runner.init_prefill_cuda_graph()
        except Exception as error:  # SGLang's runner wraps what the capture raised
            return f"{type(error).__name__}: {error}"
    return ""


if __name__ == "__main__":
    main()
