import re

import pytest
import torch

from sglang_evs.runtime.cpu_graph import CaptureError, CpuGraph, CpuGraphSegment


@torch.library.custom_op("sglang_evs_test::count_positive", mutates_args=())
def count_positive(x: torch.Tensor) -> torch.Tensor:
    """Reads its input back to Python, as a kernel reads its own memory."""
    return torch.tensor(sum(value > 0 for value in x.tolist()))


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


# --- as strict as a CUDA capture: what would wait for a captured kernel fails, naming the op


def captured_value() -> torch.Tensor:
    return torch.arange(4.0) * 2  # computed by a recorded op


@pytest.mark.parametrize(
    ("planted", "named"),
    [
        (lambda x: x.sum().item(), "aten._local_scalar_dense"),
        (lambda x: bool(x[0]), "aten._local_scalar_dense"),
        (lambda x: x.tolist(), "Tensor.tolist()"),
        (lambda x: x.numpy(), "Tensor.numpy()"),
        (lambda x: torch.equal(x, x), "aten.equal"),
        (lambda x: (x > 2).nonzero(), "aten.nonzero"),
        (lambda x: torch.where(x > 2), "aten.nonzero"),
        (lambda x: x[x > 2], "aten.index.Tensor"),
        (lambda x: x.masked_select(x > 2), "aten.masked_select"),
        (lambda x: torch.unique(x), "unique"),
        (lambda x: torch.repeat_interleave(x.long()), "aten.repeat_interleave.Tensor"),
        (lambda x: x.__setitem__(x > 2, x[:1]), "aten.index_put_"),
    ],
)
def test_a_capture_refuses_to_wait_for_what_it_computed(planted, named):
    graph = CpuGraph()
    with pytest.raises(CaptureError, match=re.escape(named)) as refused, graph:
        planted(captured_value())
    assert "operation not permitted when stream is capturing" in str(refused.value)


def test_values_written_in_place_during_a_capture_are_computed_too():
    before = torch.zeros(3)
    with pytest.raises(CaptureError, match="_local_scalar_dense"), CpuGraph():
        before.add_(1)
        before[0].item()


def test_host_tensors_from_before_the_capture_stay_readable():
    """SGLang's `*_cpu` metadata and Python constants: host memory on a GPU, read at capture and frozen."""
    seq_lens_cpu, mask = torch.tensor([3, 5, 2]), torch.tensor([True, False, True])
    graph = CpuGraph()
    with graph:
        out = captured_value()
        read = (seq_lens_cpu.tolist(), int(seq_lens_cpu[1]), bool(mask[0]), mask.tolist())
        out[mask.nonzero().flatten()] = 1.0
        out[torch.tensor([True, False, False, True])] = 7.0  # one host value under a mask: CUDA's masked_fill_
        counts = torch.arange(4).repeat_interleave(out.long(), output_size=17)  # sized by the caller
    assert read == ([3, 5, 2], 5, True, [True, False, True]) and out.tolist() == [7.0, 2.0, 1.0, 7.0]
    assert counts.shape == (17,) and graph.ops  # recorded as usual


def test_synchronize_fails_during_a_segments_capture_only(cpu_graph_stand_ins):
    torch.cpu.synchronize()
    segment = CpuGraphSegment()
    segment.capture_begin()
    try:
        with pytest.raises(CaptureError, match=r"torch\.cuda\.synchronize"):
            torch.cpu.synchronize()
    finally:
        segment.capture_end()
    torch.cpu.synchronize()


def test_a_recorded_ops_own_body_is_a_kernel_not_the_captured_body():
    """A custom op (the CPU route's attention and MoE) replays whole, as one GPU kernel: what its body reads
    back is read at every replay, not frozen, so the capture lets it."""
    graph = CpuGraph()
    with graph:
        out = torch.ops.sglang_evs_test.count_positive(captured_value() - 3)
    assert out.item() == 2
