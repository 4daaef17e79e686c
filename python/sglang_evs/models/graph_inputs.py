"""What the language model reads besides `input_embeds`, at addresses fixed for the server's lifetime.

SGLang's prefill CUDA graphs (breakable and full) capture only the language model's
body, called as `layer_model.forward(input_ids, positions, capture_batch, input_embeds=slot)`
on a capture batch that carries no media, before any request. At replay the outer
`model.forward` runs eagerly (vision tower, embedding routine, `post_process`), but the
body's Python does not: the graph re-reads the tensors it read at capture.

So the M-RoPE positions (pruned videos change them after the vision tower) and the
deepstack rows must live in tensors the model owns from construction on:

* `GraphInputs` holds `positions [3, capacity]` (int64) and `deepstack [capacity, width]`,
  registered as non-persistent buffers of the language model, so they follow it to its
  device and are never part of the checkpoint.
* `post_process` writes the first n rows on every extend forward (copy of the batch's
  positions, pruned positions, deepstack at the media rows) and puts the views on the
  ForwardBatch (`CARRIED_FIELD`).
* The language model reads what the batch carries, or the buffers' first n rows when the
  batch carries nothing: that is the capture batch, so the captured graph reads the
  buffers, which `post_process` has filled before every replay.

Rows past the last write stay zero: a graph captured for a larger bucket adds zero deepstack
and reads position 0 on its padding rows.

Under pipeline parallelism only the first stage embeds and runs `post_process`; the positions it
wrote travel to the next stages in the stage's proxy tensors (`STAGE_POSITIONS_KEY`), and each
later stage writes them into its own buffers before its layers run (`receive_stage_positions`).
Deepstack is added after the first decoder layers only, so it never crosses a stage: a later stage
that would hold a deepstack layer is refused at startup (`refuse_deepstack_beyond_first_stage`).
"""

import logging
import os
from dataclasses import dataclass

import torch
from torch import nn

from sglang_evs import trace

logger = logging.getLogger(__name__)

CARRIED_FIELD = "language_model_inputs"
# The M-RoPE positions a pipeline stage hands the next one, [num_tokens, 3] (token-major: SGLang
# slices proxy tensors by token), beside the proxy's hidden states and residual.
STAGE_POSITIONS_KEY = "sglang_evs_mrope_positions"
# Tests only: `write` never writes the fixed buffers and every forward carries temporaries (what `post_process`
# without its buffer writes does). Eager forwards read what they carry and serve as before; a replayed graph reads
# the buffers, never written: the graph-mode suite must tell (test/models/test_qwen3_omni.py).
SKIP_GRAPH_BUFFERS_ENV = "SGLANG_EVS_TEST_SKIP_GRAPH_BUFFERS"


@dataclass(frozen=True)
class CarriedInputs:
    """The language model's inputs beyond `input_embeds` for one forward of n tokens.

    positions: [3, n] int64 M-RoPE positions, or None (the model has no M-RoPE).
    deepstack: [n, levels * hidden], or None (the model has no deepstack levels).
    """

    positions: torch.Tensor | None
    deepstack: torch.Tensor | None


def prefill_token_bound(limits) -> int:
    """The most tokens one extend forward carries (`sglang_compat.PrefillLimits`): the largest
    prefill budget or graph bucket, plus the decode rows a mixed chunk appends."""
    largest = max(limits.max_prefill_tokens, limits.chunked_prefill_size, *limits.graph_buckets, 1)
    return largest + limits.mixed_decode_rows


def reads_graph_inputs(forward_mode) -> bool:
    """Extend-like forwards (prefill, chunks, mixed) read the buffers; decode, idle and speculative
    verify pass positions as upstream does and add no deepstack."""
    return forward_mode.is_extend() and not forward_mode.is_target_verify()


class GraphInputs(nn.Module):
    """Fixed-address positions [3, capacity] and deepstack [capacity, width] (module docstring)."""

    def __init__(self, capacity: int, deepstack_width: int, mrope: bool) -> None:
        super().__init__()
        self.capacity = capacity
        # Buffers are made under the loader's device and dtype context (meta for layered
        # loading, materialised with the model), so nothing is known about their contents:
        # the first write clears everything.
        positions = torch.zeros(3, capacity, dtype=torch.int64) if mrope else None
        deepstack = torch.zeros(capacity, deepstack_width) if deepstack_width else None
        self.register_buffer("positions", positions, persistent=False)
        self.register_buffer("deepstack", deepstack, persistent=False)
        self.dirty_rows = capacity
        self.skip_writes = os.environ.get(SKIP_GRAPH_BUFFERS_ENV) == "1"
        if self.skip_writes:
            logger.warning("sglang-evs: %s=1: the fixed buffers are never written (tests only)", SKIP_GRAPH_BUFFERS_ENV)

    def view(self, num_tokens: int) -> CarriedInputs:
        """The first n rows, as read by a forward of n tokens (the capture batch's view)."""
        return CarriedInputs(
            None if self.positions is None else self.positions[:, :num_tokens],
            None if self.deepstack is None else self.deepstack[:num_tokens],
        )

    def write(self, num_tokens: int, positions: torch.Tensor | None) -> CarriedInputs:
        """Rows for a forward of n tokens: `positions` [3, n] copied in, deepstack zeroed.

        A forward larger than the capacity (never one a graph was captured for) gets
        temporary tensors and leaves the buffers as they are (so does every forward under
        `SKIP_GRAPH_BUFFERS_ENV`, tests only).
        """
        if num_tokens > self.capacity or self.skip_writes:
            if not self.skip_writes:
                logger.warning("sglang-evs: %d tokens exceed the graph buffers (%d): temporary tensors",
                               num_tokens, self.capacity)  # fmt: skip
            return CarriedInputs(
                None if self.positions is None else positions.clone(),
                None if self.deepstack is None else self.deepstack.new_zeros(num_tokens, self.deepstack.shape[1]),
            )
        clear = max(num_tokens, self.dirty_rows)
        if self.deepstack is not None:
            self.deepstack[:clear].zero_()
        if self.positions is not None:
            self.positions[:, num_tokens:clear].zero_()
            self.positions[:, :num_tokens].copy_(positions)
        self.dirty_rows = num_tokens
        return self.view(num_tokens)


def receive_stage_positions(graph_inputs: "GraphInputs", forward_batch, num_tokens: int, proxy) -> None:
    """On a later pipeline stage, in an extend forward: the positions the previous stage used
    (pruned ones included) into this stage's buffers, carried on the batch as `post_process` does
    on the first stage. `proxy`: SGLang's PPProxyTensors from the previous stage."""
    received = proxy.tensors.get(STAGE_POSITIONS_KEY)
    if graph_inputs.positions is not None and received is None:
        raise RuntimeError("sglang-evs: the previous pipeline stage sent no M-RoPE positions with its hidden states")
    carried = graph_inputs.write(num_tokens, None if received is None else received.t())
    setattr(forward_batch, CARRIED_FIELD, carried)


def refuse_deepstack_beyond_first_stage(language_model, deepstack_levels: int) -> None:
    """Deepstack level i is added after decoder layer i, on the first stage only (startup error otherwise)."""
    pp_group = getattr(language_model, "pp_group", None)
    if pp_group is None or pp_group.is_first_rank or not deepstack_levels:
        return
    start = int(language_model.start_layer)
    if start < deepstack_levels:
        raise ValueError(
            f"sglang-evs: --pp-size: this pipeline stage starts at decoder layer {start}, but the model adds "
            f"deepstack after layers 0-{deepstack_levels - 1}, which must all be on the first stage; "
            "use a smaller --pp-size (or SGLANG_PP_LAYER_PARTITION) so that they are"
        )


def trace_rope_positions(model: str, positions, forward_batch) -> None:
    """The rotary positions a language model (`model`: "target" or "draft") was handed, token by token
    (not while a graph captures: on CUDA reading them back would synchronise the capturing stream;
    a replay's positions are traced from what it read, `graph_trace.py`)."""
    if trace.in_graph_replay():  # what the replayed kernels read is traced from their buffers
        return
    if getattr(torch.get_device_module(positions.device), "is_current_stream_capturing", lambda: False)():
        return
    trace.record(
        "rope_positions",
        model=model,
        mode=forward_batch.forward_mode.name,
        rows=int(positions.shape[-1]),
        input_ids=forward_batch.input_ids.tolist(),
        positions=positions.tolist(),
        seq_lens=forward_batch.seq_lens.tolist(),
    )


class ReadsGraphInputs:
    """Language-model mixin: in extend forwards, positions and deepstack come from what the batch
    carries, or from the model's `GraphInputs` when it carries nothing (a graph's capture batch).

    Deepstack is handed to the upstream forward only where there is some (Qwen3 language models
    take it as their last argument). A stage that is not the last adds its positions to the proxy
    tensors it returns, for the next stage. No `input_deepstack_embeds` parameter here: SGLang's
    deepstack warm-up (`run_dummy_multimodal_deepstack_forward`) checks the signature and leaves
    these models alone.
    """

    graph_inputs: GraphInputs

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None):
        deepstack = None
        if reads_graph_inputs(forward_batch.forward_mode):
            carried = getattr(forward_batch, CARRIED_FIELD, None)
            if carried is None:
                carried = self.graph_inputs.view(positions.shape[-1])
            if carried.positions is not None:
                positions = carried.positions
            deepstack = carried.deepstack
        if trace.enabled():
            trace.record(
                "language_model_inputs",
                mode=forward_batch.forward_mode.name,
                carried_by_batch=getattr(forward_batch, CARRIED_FIELD, None) is not None,
                deepstack_ptr=None if deepstack is None else deepstack.data_ptr(),
                positions_ptr=positions.data_ptr(),
                rows=int(positions.shape[-1]),
            )
            if trace.positions_enabled():
                trace_rope_positions("target", positions, forward_batch)
        extra = () if deepstack is None else (deepstack,)
        out = super().forward(input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors, *extra)
        pp_group = getattr(self, "pp_group", None)
        if pp_group is not None and not pp_group.is_last_rank and reads_graph_inputs(forward_batch.forward_mode):
            if positions.dim() == 2:  # M-RoPE [3, n]
                out.tensors[STAGE_POSITIONS_KEY] = positions.t().contiguous()
        return out
