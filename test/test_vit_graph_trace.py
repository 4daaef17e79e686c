"""The trace of SGLang's vision-tower CUDA graphs (`graph_trace.trace_vit_graph_replay`), on CPU: SGLang's own
`ViTCudaGraphRunner.run` calls its `replay` by keyword, through the hook, with a stand-in for the captured graph
(capture needs a CUDA device: the GPU check, test/models/test_prefill_cuda_graph_gpu.py, replays real ones);
and the plugin registers the hook only while tracing."""

import pytest
import torch
from torch import nn

from sglang_evs import graph_trace, plugin, trace
from sglang_evs import sglang_compat as sglang


class CapturedGraph:
    """A captured graph's stand-in: a replay writes the runner's static output buffer, as the kernels would."""

    def __init__(self, output: torch.Tensor) -> None:
        self.output, self.replays = output, 0

    def replay(self) -> None:
        self.replays += 1
        self.output.fill_(float(self.replays))


def captured_runner(*lengths: int):
    """SGLang's runner over a one-block tower, a graph 'captured' for each sequence length (one image each)."""
    from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner

    tower = nn.Module()
    tower.blocks = nn.ModuleList([nn.Identity()])
    runner = ViTCudaGraphRunner(tower)
    for length in lengths:
        x_3d = torch.zeros(length, 1, 4)
        key = runner._get_graph_key(x_3d, torch.tensor([0, length]), None)
        runner.block_input[key], runner.block_output[key] = torch.zeros_like(x_3d), torch.zeros_like(x_3d)
        runner.block_graphs[key] = CapturedGraph(runner.block_output[key])
    return runner


def test_each_replay_of_a_tower_graph_is_traced(monkeypatch, tmp_path):
    from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner

    monkeypatch.setenv(trace.ENV, str(tmp_path / "trace.jsonl"))
    monkeypatch.setattr(graph_trace, "_vit_graphs_replayed", set())
    original = ViTCudaGraphRunner.replay

    def hooked(runner, *args, **kwargs):  # what HookRegistry's AROUND hook makes of the method
        return graph_trace.trace_vit_graph_replay(original, runner, *args, **kwargs)

    monkeypatch.setattr(ViTCudaGraphRunner, "replay", hooked)
    runner = captured_runner(6, 10)
    outputs = [float(runner.run(torch.ones(n, 4), torch.tensor([0, n]), None, None)[0, 0, 0]) for n in (6, 10, 6)]
    assert outputs == [1.0, 1.0, 2.0]  # each replay's output (its static buffer), returned
    events = trace.read(tmp_path / "trace.jsonl", "vit_graph_replay")
    assert [(e["patches"], e["graphs"], e["again"]) for e in events] == [(6, 2, False), (10, 2, False), (6, 2, True)]
    key = next(iter(runner.block_graphs))
    graph_trace.trace_vit_graph_replay(original, runner, key, torch.ones(6, 1, 4))  # positional, as a caller may
    assert trace.read(tmp_path / "trace.jsonl", "vit_graph_replay")[-1]["again"] is True


@pytest.mark.parametrize("tracing", [True, False])
def test_registered_only_while_tracing(monkeypatch, tmp_path, tracing):
    calls = []
    monkeypatch.setattr(
        sglang.HookRegistry, "register", lambda target, hook, kind=None, **_: calls.append((target, hook, kind))
    )
    if tracing:
        monkeypatch.setenv(trace.ENV, str(tmp_path / "trace.jsonl"))
    else:
        monkeypatch.delenv(trace.ENV, raising=False)
    plugin.register_hooks()
    vit = [(hook, kind) for target, hook, kind in calls if target == sglang.hook_target("vit_graph_replay")]
    assert vit == ([(graph_trace.trace_vit_graph_replay, sglang.HookType.AROUND)] if tracing else [])
    assert sglang.hook_target("vit_graph_replay").endswith("ViTCudaGraphRunner.replay")
