import torch

from sglang_evs.runtime.cpu_graph import CpuGraph, CpuGraphSegment


def test_replay_recomputes_from_the_captured_tensors_without_python():
    static_in = torch.randn(4, 3)
    weight = torch.randn(3, 3)
    picked = {"bias": torch.ones(3)}

    def body(x):
        return torch.relu(x @ weight + picked["bias"]).sum(dim=0)

    graph = CpuGraph()
    with graph:
        out = body(static_in)
    new_in = torch.randn(4, 3)
    static_in.copy_(new_in)
    picked["bias"] = torch.zeros(3)  # Python state a replay cannot see
    graph.replay()
    assert torch.allclose(out, torch.relu(new_in @ weight + 1).sum(dim=0))
    assert graph.reads(weight) and not graph.reads(picked["bias"])


def test_in_place_ops_and_views_replay_on_the_same_storage():
    buffer = torch.zeros(6)
    source = torch.arange(3.0)

    graph = CpuGraph()
    with graph:
        view = buffer[:3]
        view.copy_(source)
        total = buffer.sum()
    source.fill_(5.0)
    graph.replay()
    assert torch.equal(buffer[:3], torch.full((3,), 5.0)) and total.item() == 15.0


def test_segment_has_the_cuda_graph_capture_api():
    static_in, weight = torch.randn(2, 3), torch.randn(3, 3)
    segment = CpuGraphSegment()
    segment.capture_begin(pool=(0, 0), capture_error_mode="global")
    out = static_in @ weight
    segment.capture_end()
    eager_after_capture = static_in @ weight  # not recorded: the segment ended
    new_in = torch.randn(2, 3)
    static_in.copy_(new_in)
    segment.replay()
    assert torch.equal(out, new_in @ weight) and not torch.equal(eager_after_capture, out)
    assert len(segment.graph.ops) == 1
