"""A pruned video in a later session turn moves with the turn (`pruning/sessions.py`), through SGLang's own
`Req._extend_session_image_inputs`, which appends a turn's media to the session's request."""

import types
from array import array

import pytest
import torch
from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs, Req

from sglang_evs.pruning.fields import RATE, REGION_POSITIONS
from sglang_evs.pruning.sessions import move_pruned_regions_with_the_turn

# A turn of 8 tokens laid out on its own: text(2) | a video region of 4 rows (one 2x2 group at t = 2) | text(2).
TURN_POSITIONS = torch.tensor([[0, 1, 2, 2, 2, 2, 4, 5], [0, 1, 2, 2, 3, 3, 4, 5], [0, 1, 2, 3, 2, 3, 4, 5]])
REGION = slice(2, 6)


def video_item(pruned: bool):
    item = MultimodalDataItem(modality=Modality.VIDEO, offsets=[(REGION.start, REGION.stop - 1)])
    item.set(REGION_POSITIONS, TURN_POSITIONS[:, REGION].clone())
    if pruned:
        item.set(RATE, 0.5)
    return item


def append_turn(history: int, gap: int, items: list) -> types.SimpleNamespace:
    """A session request whose history is `history` prompt tokens (positions 0..history-1) and `gap` tokens of
    reply and text since, appended the turn through SGLang's own method with the hook around it."""
    past = None
    if history:
        past = MultimodalInputs(mm_items=[], mrope_positions=torch.arange(history).expand(3, -1).clone())
    ids = array("q", range(history + gap + TURN_POSITIONS.shape[1]))
    req = types.SimpleNamespace(
        _session_mm_items=[], full_untruncated_fill_ids=array("q"), multimodal_inputs=past, origin_input_ids=ids
    )
    turn = MultimodalInputs(mm_items=items, mrope_positions=TURN_POSITIONS.clone())
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
