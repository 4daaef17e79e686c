import torch

from sglang_evs.models.graph_inputs import GraphInputs, prefill_token_bound, reads_graph_inputs
from sglang_evs.sglang_compat import PrefillLimits


def test_bound_covers_every_graph_bucket_and_mixed_decode_rows():
    assert prefill_token_bound(PrefillLimits(16384, 8192, (256, 512), 0)) == 16384
    assert prefill_token_bound(PrefillLimits(1024, 512, (4096,), 0)) == 4096
    assert prefill_token_bound(PrefillLimits(1024, 512, (), 48)) == 1072
    assert prefill_token_bound(PrefillLimits()) == 1


def test_write_keeps_one_address_and_clears_what_an_earlier_forward_left():
    buffers = GraphInputs(capacity=16, deepstack_width=4, mrope=True)
    ptrs = (buffers.positions.data_ptr(), buffers.deepstack.data_ptr())
    buffers.positions.fill_(-1)  # unknown contents, as after a meta-device load
    buffers.deepstack.fill_(7.0)
    carried = buffers.write(10, torch.arange(30).reshape(3, 10))
    carried.deepstack[2:5] = 1.0
    assert torch.equal(buffers.positions[:, :10], torch.arange(30).reshape(3, 10))
    assert not buffers.positions[:, 10:].any() and not buffers.deepstack[5:].any()

    carried = buffers.write(3, torch.ones(3, 3, dtype=torch.int64))
    assert not carried.deepstack.any()
    assert not buffers.deepstack.any() and not buffers.positions[:, 3:].any()  # a larger bucket reads zeros
    assert (buffers.positions.data_ptr(), buffers.deepstack.data_ptr()) == ptrs
    assert carried.deepstack.data_ptr() == ptrs[1]


def test_oversized_forward_gets_temporaries_and_leaves_the_buffers():
    buffers = GraphInputs(capacity=4, deepstack_width=2, mrope=True)
    buffers.write(2, torch.full((3, 2), 9))
    carried = buffers.write(6, torch.arange(18).reshape(3, 6))
    assert carried.deepstack.shape == (6, 2) and not carried.deepstack.any()
    assert carried.deepstack.data_ptr() != buffers.deepstack.data_ptr()
    assert torch.equal(carried.positions, torch.arange(18).reshape(3, 6))
    assert torch.equal(buffers.positions[:, :2], torch.full((3, 2), 9))


def test_models_without_deepstack_or_mrope_carry_none():
    buffers = GraphInputs(capacity=4, deepstack_width=0, mrope=False)
    carried = buffers.write(3, None)
    assert carried.positions is None and carried.deepstack is None


def test_only_extend_forwards_read_the_buffers():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    assert reads_graph_inputs(ForwardMode.EXTEND) and reads_graph_inputs(ForwardMode.MIXED)
    assert not reads_graph_inputs(ForwardMode.DECODE)
    assert not reads_graph_inputs(ForwardMode.TARGET_VERIFY)
    assert not reads_graph_inputs(ForwardMode.IDLE)
