"""`admission`: a threshold's layout decided when the scheduler receives the request, on made-up processor outputs."""

from array import array
from types import SimpleNamespace

import pytest
import torch

from sglang_evs.pruning.admission import lay_out_at_admission, lay_out_by_threshold
from sglang_evs.pruning.fields import THRESHOLD, THRESHOLD_KEPT, VIDEO_TOKENS, awaits_threshold

TEXT, IMAGE_PAD, VIDEO_PAD = 1, 8, 9
SETTING = {"threshold": 0.3, "token_budget": 0, "min_tokens_per_group": 0}


class Item(SimpleNamespace):
    def __init__(self, modality: str, offsets: list, waits: bool = False):
        data = {THRESHOLD: dict(SETTING)} if waits else {}
        super().__init__(modality=modality, offsets=offsets, hash=None, model_specific_data=data)

    def is_video(self) -> bool:
        return self.modality == "video"

    def set(self, key, value) -> None:
        self.model_specific_data[key] = value


class Output(SimpleNamespace):
    @staticmethod
    def build_padded_input_ids(input_ids, mm_items):
        return [f"padded:{len(input_ids)}:{len(mm_items)}"]


def output() -> Output:
    """Text, an image (2 pads), then a video of two groups of 3 pads, each group after a timestamp token (one
    span per group, as Qwen3-VL lays it out), then a second video of one group of 2 pads."""
    ids = [TEXT, IMAGE_PAD, IMAGE_PAD, TEXT, *[VIDEO_PAD] * 3, TEXT, *[VIDEO_PAD] * 3, TEXT, *[VIDEO_PAD] * 2, TEXT]
    items = [Item("image", [(1, 2)]), Item("video", [(4, 6), (8, 10)], waits=True), Item("video", [(12, 13)], True)]
    return Output(input_ids=ids, mrope_positions=torch.arange(3 * len(ids)).reshape(3, -1),
                  mrope_position_delta=torch.tensor([[4]]), mm_items=items, padded_input_ids=None)  # fmt: skip


def test_the_pruned_pads_are_deleted_at_their_unpruned_positions_and_the_masks_stay_on_the_items():
    masks = [torch.tensor([True, True, False, False, True, False]), torch.tensor([True, True])]
    decided = []

    def decide(item):
        decided.append(item)
        return masks[len(decided) - 1]

    out, unpruned = output(), output()
    lay_out_by_threshold(out, decide, VIDEO_PAD)
    keep = torch.tensor([True] * 6 + [False, True, False, True, False] + [True] * 4)
    assert out.input_ids == torch.tensor(unpruned.input_ids)[keep].tolist()
    assert torch.equal(out.mrope_positions, unpruned.mrope_positions[:, keep])
    assert int(out.mrope_position_delta) == 4 + 3
    assert [item.offsets for item in out.mm_items] == [[(1, 2)], [(4, 5), (7, 7)], [(9, 10)]]
    assert decided == out.mm_items[1:]
    for item, mask in zip(out.mm_items[1:], masks, strict=True):
        assert torch.equal(item.model_specific_data[THRESHOLD][THRESHOLD_KEPT], mask) and not awaits_threshold(item)
        assert item.model_specific_data[VIDEO_TOKENS] == (mask.numel(), int(mask.sum()))
    assert out.mm_items[0].model_specific_data == {}  # the image is not touched
    assert out.padded_input_ids == [f"padded:{len(out.input_ids)}:3"]  # the radix key of the pruned layout


def test_a_mask_of_another_length_than_the_videos_pads_is_refused():
    with pytest.raises(ValueError, match="a keep-mask of 5 tokens for a video of 6 pads"):
        lay_out_by_threshold(output(), lambda item: torch.ones(5, dtype=torch.bool), VIDEO_PAD)


def test_the_hook_lays_a_waiting_request_out_and_leaves_every_other_request_as_it_came():
    calls = []

    def original(scheduler, recv_req):
        calls.append(recv_req)
        return "handled"

    videos = SimpleNamespace(
        pad_token_id=VIDEO_PAD,
        decide_threshold=lambda item: torch.ones(
            sum(end - start + 1 for start, end in item.offsets), dtype=torch.bool
        ).index_fill_(0, torch.tensor([0]), False),
    )
    scheduler = SimpleNamespace(tp_worker=SimpleNamespace(model_runner=SimpleNamespace(model=SimpleNamespace(
        pruned_videos=videos))))  # fmt: skip
    waiting = SimpleNamespace(input_ids=array("q", output().input_ids), mm_inputs=output())
    assert lay_out_at_admission(original, scheduler, waiting) == "handled"
    assert isinstance(waiting.input_ids, array) and list(waiting.input_ids) == waiting.mm_inputs.input_ids
    assert len(waiting.input_ids) == len(output().input_ids) - 2  # each video's first pad pruned
    plain = output()
    for item in plain.mm_items:
        item.model_specific_data.clear()
    ids = array("q", plain.input_ids)
    for request in (SimpleNamespace(input_ids=ids, mm_inputs=plain), SimpleNamespace(input_ids=ids, mm_inputs=None)):
        lay_out_at_admission(original, None, request)  # no model is asked: not this plugin's request to lay out
        assert calls[-1] is request and request.input_ids is ids
    assert plain.input_ids == output().input_ids


def test_a_layout_that_fails_fails_its_request_as_sglang_fails_bad_media_and_the_scheduler_serves_on():
    from sglang_evs import sglang_compat as sglang

    def decide(item):
        raise RuntimeError("the tower failed")

    videos = SimpleNamespace(pad_token_id=VIDEO_PAD, decide_threshold=decide)
    scheduler = SimpleNamespace(tp_worker=SimpleNamespace(model_runner=SimpleNamespace(model=SimpleNamespace(
        pruned_videos=videos))))  # fmt: skip
    request = SimpleNamespace(rid="r", input_ids=array("q", output().input_ids), mm_inputs=output())
    handled = []
    lay_out_at_admission(lambda scheduler_, recv_req: handled.append(recv_req), scheduler, request)
    assert handled == [request]  # handed on: SGLang aborts it (HTTP 500) and goes on
    assert isinstance(request.mm_inputs, sglang.MMInputsProcessError)
    assert request.mm_inputs.message == "sglang-evs: video_pruning_threshold: the tower failed"
