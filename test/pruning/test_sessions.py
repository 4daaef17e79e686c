"""A pruned video in a later session turn moves with the turn (`pruning/sessions.py`), through SGLang's own
`Req._extend_session_image_inputs`, which appends a turn's media to the session's request; a session turn's
input logprobs over a pruned video of its session are refused in the scheduler."""

import types
from array import array

import pytest
import torch
from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs, Req
from sglang.srt.session.session_controller import SessionController

from sglang_evs.pruning.fields import METHOD, RATE, REGION_POSITIONS
from sglang_evs.pruning.sessions import (
    move_pruned_regions_with_the_turn,
    refuse_session_logprobs_over_pruned_videos,
)

# A turn of 8 tokens laid out on its own: text(2) | a video region of 4 rows (one 2x2 group at t = 2) | text(2).
TURN_POSITIONS = torch.tensor([[0, 1, 2, 2, 2, 2, 4, 5], [0, 1, 2, 2, 3, 3, 4, 5], [0, 1, 2, 3, 2, 3, 4, 5]])
REGION = slice(2, 6)


def video_item(pruned: bool):
    item = MultimodalDataItem(modality=Modality.VIDEO, offsets=[(REGION.start, REGION.stop - 1)])
    item.set(REGION_POSITIONS, TURN_POSITIONS[:, REGION].clone())
    if pruned:
        item.set(METHOD, "evs")
        item.set(RATE, 0.5)
    return item


def append_turn(history: int, gap: int, items: list) -> types.SimpleNamespace:
    """A session request whose history is `history` prompt tokens (positions 0..history-1) and `gap` tokens of
    reply and text since, appended the turn as SGLang's scheduler appends one (its offsets moved past the history,
    then its media appended with the hook around it)."""
    past = None
    if history:
        past = MultimodalInputs(mm_items=[], mrope_positions=torch.arange(history).expand(3, -1).clone())
    ids = array("q", range(history + gap + TURN_POSITIONS.shape[1]))
    req = types.SimpleNamespace(
        _session_mm_items=[], full_untruncated_fill_ids=array("q"), multimodal_inputs=past, origin_input_ids=ids
    )
    turn = MultimodalInputs(mm_items=items, mrope_positions=TURN_POSITIONS.clone())
    SessionController.adjust_mm_offsets(types.SimpleNamespace(input_ids=ids[history + gap :]), req, turn)
    move_pruned_regions_with_the_turn(Req._extend_session_image_inputs, req, turn)
    return req


@pytest.mark.parametrize(("history", "gap"), [(10, 4), (0, 0)], ids=["later turn", "first turn"])
def test_a_pruned_videos_region_positions_move_where_sglang_moved_its_rows(history, gap):
    pruned, unpruned = video_item(pruned=True), video_item(pruned=False)
    req = append_turn(history, gap, [pruned, unpruned])
    moved = req.multimodal_inputs.mrope_positions
    start = history + gap  # the turn's first token in the session's request
    assert torch.equal(moved[:, start:], TURN_POSITIONS + history + gap)  # SGLang's own move: max + 1 + the gap
    assert torch.equal(
        pruned.model_specific_data[REGION_POSITIONS], moved[:, start + REGION.start : start + REGION.stop]
    )
    assert torch.equal(unpruned.model_specific_data[REGION_POSITIONS], TURN_POSITIONS[:, REGION])  # not the plugin's


@pytest.mark.parametrize("served", [True, False], ids=["served model", "another model"])
def test_a_turn_sglang_refused_is_not_appended_where_the_plugin_serves_the_model(monkeypatch, served):
    """A streaming session's turn sent while the one before it runs: SGLang refuses it (its prompt cut to one token)
    and still appends its media, which stops the scheduler; for the models the plugin serves it is not appended."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    from sglang_evs.pruning import sessions

    monkeypatch.setattr(sessions, "serves_this_model", lambda: served)
    past = MultimodalInputs(mm_items=[], mrope_positions=torch.arange(10).expand(3, -1).clone())
    req = types.SimpleNamespace(_session_mm_items=[], full_untruncated_fill_ids=array("q"), multimodal_inputs=past,
                                origin_input_ids=array("q", [0]), to_finish=FINISH_ABORT("active request"))  # fmt: skip
    turn = MultimodalInputs(mm_items=[video_item(pruned=True)], mrope_positions=TURN_POSITIONS.clone())
    if not served:  # upstream's own path, left to it
        with pytest.raises(RuntimeError, match="inconsistent with step sign"):
            move_pruned_regions_with_the_turn(Req._extend_session_image_inputs, req, turn)
        return
    move_pruned_regions_with_the_turn(Req._extend_session_image_inputs, req, turn)
    assert req.multimodal_inputs is past and req._session_mm_items == []


class _SessionTurn(types.SimpleNamespace):
    """The parts of SGLang's Req the scheduler-side refusal reads and sets."""

    def set_finish_with_abort(self, message: str) -> None:
        self.to_finish = message


@pytest.mark.parametrize(("start", "refused"), [(0, True), (19, True), (20, False), (-1, False)])
def test_a_session_turns_input_logprobs_over_a_pruned_video_of_its_session_are_refused(start, refused):
    """The turn appended after a 14-token history: its pruned video's region is tokens 16..19 of the session's
    prompt, so a start of 20 (the first token after it) is served, any earlier one refused naming the setting."""
    req = append_turn(10, 4, [video_item(pruned=True)])
    turn = _SessionTurn(session=object(), to_finish=None, return_logprob=True, logprob_start_len=start,
                        multimodal_inputs=req.multimodal_inputs, origin_input_ids=req.origin_input_ids)  # fmt: skip
    refuse_session_logprobs_over_pruned_videos(None, turn)
    if refused:
        assert turn.to_finish.startswith(f"logprob_start_len={start}: input logprobs over a video pruned with ")
        assert "video_pruning_rate=0.5 (evs)" in turn.to_finish and "logprob_start_len=20 on" in turn.to_finish
    else:
        assert turn.to_finish is None
    without_session = _SessionTurn(**{**vars(turn), "session": None, "to_finish": None})
    refuse_session_logprobs_over_pruned_videos(None, without_session)  # the processor checked it
    assert without_session.to_finish is None
