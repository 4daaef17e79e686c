from types import SimpleNamespace

import pytest
import torch

from sglang_evs.models.adapter import _split_deepstack, attach
from sglang_evs.models.graph_inputs import (
    CARRIED_FIELD,
    SKIP_GRAPH_BUFFERS_ENV,
    STAGE_POSITIONS_KEY,
    GraphInputs,
    ReadsGraphInputs,
    prefill_token_bound,
    reads_graph_inputs,
    receive_stage_positions,
    refuse_deepstack_beyond_first_stage,
)
from sglang_evs.multimodal.contract import FetchedEmbedding
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


def test_the_test_switch_leaves_the_buffers_unwritten_and_carries_temporaries(monkeypatch):
    """`SKIP_GRAPH_BUFFERS_ENV` (tests only: the served broken copy of test_qwen3_omni.py) is read when the
    buffers are made: every forward then carries what a forward past the capacity carries."""
    monkeypatch.setenv(SKIP_GRAPH_BUFFERS_ENV, "1")
    buffers = GraphInputs(capacity=8, deepstack_width=2, mrope=True)
    buffers.positions.zero_()
    carried = buffers.write(3, torch.arange(9).reshape(3, 3))
    assert torch.equal(carried.positions, torch.arange(9).reshape(3, 3)) and not buffers.positions.any()
    assert carried.deepstack.shape == (3, 2) and carried.deepstack.data_ptr() != buffers.deepstack.data_ptr()
    monkeypatch.delenv(SKIP_GRAPH_BUFFERS_ENV)
    buffers = GraphInputs(capacity=8, deepstack_width=2, mrope=True)
    assert buffers.write(3, torch.arange(9).reshape(3, 3)).positions.data_ptr() == buffers.positions.data_ptr()


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


class Proxy:  # SGLang's PPProxyTensors: a dict of tensors
    def __init__(self, tensors: dict) -> None:
        self.tensors = tensors


def test_a_later_pipeline_stage_reads_the_positions_the_first_one_sent():
    buffers = GraphInputs(capacity=8, deepstack_width=0, mrope=True)
    sent = torch.tensor([[0, 0, 0], [1, 1, 1], [5, 2, 3], [9, 9, 9]])  # token-major, as a stage sends them
    batch = SimpleNamespace()
    receive_stage_positions(buffers, batch, 4, Proxy({"hidden_states": torch.zeros(4, 2), STAGE_POSITIONS_KEY: sent}))
    carried = getattr(batch, CARRIED_FIELD)
    assert torch.equal(carried.positions, sent.t()) and carried.positions.data_ptr() == buffers.positions.data_ptr()
    with pytest.raises(RuntimeError, match="no M-RoPE positions"):
        receive_stage_positions(buffers, batch, 4, Proxy({"hidden_states": torch.zeros(4, 2)}))


def test_deepstack_after_a_layer_of_a_later_stage_is_refused():
    class Stage:
        def __init__(self, first: bool, start: int) -> None:
            self.pp_group = type("Group", (), {"is_first_rank": first})()
            self.start_layer = start

    refuse_deepstack_beyond_first_stage(Stage(first=True, start=0), 3)
    refuse_deepstack_beyond_first_stage(Stage(first=False, start=3), 3)
    refuse_deepstack_beyond_first_stage(Stage(first=False, start=1), 0)
    with pytest.raises(ValueError, match="starts at decoder layer 2.*layers 0-2"):
        refuse_deepstack_beyond_first_stage(Stage(first=False, start=2), 3)


def test_attach_refuses_a_language_model_it_cannot_reclass():
    class Upstream(torch.nn.Module):
        pass

    class Ours(ReadsGraphInputs, Upstream):
        pass

    class Unknown(torch.nn.Module):
        pass

    model = type("SomeVLM", (), {})()
    model.model = Unknown()
    with pytest.raises(TypeError, match="SomeVLM built a .*Unknown language model.*only upstream's .*Upstream"):
        attach(model, None, Ours, 0, None)


def test_deepstack_rows_go_to_the_buffer_and_a_medium_without_levels_passes_whole():
    """Video rows [main | level 1 | level 2] split into the buffer; Qwen3-Omni's audio rows (main only) pass."""
    hidden, buffers = 2, GraphInputs(capacity=6, deepstack_width=4, mrope=False)
    carried = buffers.write(6, None)
    video_mask = torch.tensor([0, 1, 1, 0, 0, 0], dtype=torch.bool)[:, None]
    audio_mask = torch.tensor([0, 0, 0, 1, 1, 0], dtype=torch.bool)[:, None]
    video = FetchedEmbedding("video", torch.arange(12.0).reshape(2, 6), video_mask)
    audio = FetchedEmbedding("audio", torch.full((2, hidden), 9.0), audio_mask)
    main = _split_deepstack([video, audio], carried, hidden)
    assert torch.equal(main[0].embedding, torch.tensor([[0.0, 1.0], [6.0, 7.0]])) and main[1] is audio
    assert torch.equal(buffers.deepstack[1:3], torch.tensor([[2.0, 3.0, 4.0, 5.0], [8.0, 9.0, 10.0, 11.0]]))
    assert not buffers.deepstack[[0, 3, 4, 5]].any()
