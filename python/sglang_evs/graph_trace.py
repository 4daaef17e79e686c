"""What SGLang's graph runners replayed (registered only while tracing, `SGLANG_EVS_TRACE`).

A replayed graph runs none of the model's Python, so the trace the model's forward writes
(`language_model_inputs`, `rope_positions`) covers eager forwards and graph captures only. This
AROUND hook on each runner's `execute` records every replay as a `graph_replay` event:

    phase       prefill | decode (decode and target verify) | draft_decode | draft_extend
    model       target | draft
    mode        the forward mode; requests and tokens: the live batch (before bucket padding)
    media       whether the batch carries media inputs
    positions_from  which static position buffer the replayed kernels read: the model's own
                `graph_inputs` buffer, SGLang's `mrope_positions` or its 1-D `positions` slot. Known
                where graphs run on the CPU stand-ins (`runtime/cpu_graph.py`, graph mode), which
                record every kernel's inputs; None on CUDA.

With positions traced (`SGLANG_EVS_TRACE_POSITIONS=1`) each replay also writes the `rope_positions`
event an eager forward writes, from the buffer the replay read, as the runner loaded it for the replay.

SGLang's vision-tower graphs (`ViTCudaGraphRunner`, on with `SGLANG_VIT_ENABLE_CUDA_GRAPH=1`) are traced apart,
as `vit_graph_replay` events (`trace_vit_graph_replay`): a tower call is no language-model forward, and the
`graph_replay` events are counted as such.
"""

import torch

from sglang_evs import trace

PHASES = {  # runner class -> phase
    "PrefillCudaGraphRunner": "prefill",
    "DecodeCudaGraphRunner": "decode",
    "EAGLEDraftCudaGraphRunner": "draft_decode",
    "EAGLEDraftExtendCudaGraphRunner": "draft_extend",
}


def language_model(model):
    """The language model of a served model: its `model`, or its thinker's (Qwen3-Omni's wrapper); None."""
    return getattr(getattr(model, "thinker", model), "model", None)


def position_buffers(runner) -> dict[str, torch.Tensor]:
    """The static buffers a replay may read positions from, the most specific first."""
    buffers = {}
    graph_inputs = getattr(language_model(runner.model_runner.model), "graph_inputs", None)
    if graph_inputs is not None and graph_inputs.positions is not None:
        buffers["graph_inputs"] = graph_inputs.positions
    registry = getattr(runner, "buffer_registry", None)  # the prefill and decode runners
    static = getattr(runner, "buffers", None)  # the draft runners keep theirs here
    for name in ("mrope_positions", "positions"):
        if registry is not None and registry.has_slot(name):
            buffers[name] = registry.get_slot(name).buffer
        elif getattr(static, name, None) is not None:
            buffers[name] = getattr(static, name)
    return buffers


def read_by(segments, buffers: dict[str, torch.Tensor]) -> str | None:
    """The first of `buffers` whose memory a replayed segment's kernels read (None: none or not known)."""
    for name, buffer in buffers.items():
        if any(segment.graph.reads(buffer) for segment in segments):
            return name
    return None


def trace_graph_replay(original, runner, forward_batch, *args, **kwargs):
    """AROUND hook on the `execute` of SGLang's prefill, decode, draft-decode and draft-extend graph runners."""
    from sglang_evs.runtime import cpu_graph

    ids = forward_batch.input_ids  # a draft-decode batch carries its tokens in spec_info
    tokens = int((ids if ids is not None else forward_batch.positions).shape[0])
    buffers = position_buffers(runner)
    loaded: dict[str, torch.Tensor] = {}  # the buffers as the runner loaded them for this replay
    cpu_graph.before_next_replay(lambda: loaded.update({n: b[..., :tokens].clone() for n, b in buffers.items()}))
    cpu_graph.take_replayed()  # what replayed before this call is not this replay's
    with trace.graph_replay():
        result = original(runner, forward_batch, *args, **kwargs)
    source = read_by(cpu_graph.take_replayed(), buffers)
    model = "draft" if runner.model_runner.is_draft_worker else "target"
    trace.record(
        "graph_replay",
        phase=PHASES.get(type(runner).__name__, type(runner).__name__),
        model=model,
        mode=forward_batch.forward_mode.name,
        requests=int(forward_batch.batch_size),
        tokens=tokens,
        media=bool(forward_batch.contains_mm_inputs()),
        positions_from=source,
    )
    if source is not None and trace.positions_enabled():  # (source is known only where `loaded` was taken)
        trace.record(
            "rope_positions",
            model=model,
            mode=forward_batch.forward_mode.name,
            rows=tokens,
            input_ids=None if ids is None else ids.tolist(),
            positions=loaded[source].tolist(),
            seq_lens=forward_batch.seq_lens.tolist(),
            replayed=True,
        )
    return result


_vit_graphs_replayed: set[tuple[int, object]] = set()  # (runner id, graph key) of the tower graphs replayed here


def trace_vit_graph_replay(original, runner, *args, **kwargs):
    """AROUND hook on SGLang's `ViTCudaGraphRunner.replay`: the tower's blocks (and deepstack mergers) run as a
    captured CUDA graph. A `vit_graph_replay` event per replay: `patches` (its input rows), `graphs` (how many the
    runner has captured) and `again` (this graph was replayed before, for an earlier tower call: a reuse, not the
    replay that follows its capture). Its argument names are the runner's own (`run` passes them by keyword)."""
    graph_key = kwargs["graph_key"] if "graph_key" in kwargs else args[0]
    x_3d = kwargs["x_3d"] if "x_3d" in kwargs else args[1]
    result = original(runner, *args, **kwargs)
    seen = (id(runner), graph_key)
    again = seen in _vit_graphs_replayed
    _vit_graphs_replayed.add(seen)
    trace.record("vit_graph_replay", patches=int(x_3d.shape[0]), graphs=len(runner.block_graphs), again=again)
    return result
