"""A pruned video in a later turn of a session (SGLang's `session_params`, streaming sessions alike).

SGLang lays a session turn out on its own (its processor sees only the turn's text and media, positions
from 0) and moves the turn's M-RoPE positions past the session's history when it appends the turn
(`Req._extend_session_image_inputs`: every position of the turn plus one shift, `previous maximum + 1 +
the text in between`). A pruned video also carries its unpruned region positions on its item
(`fields.REGION_POSITIONS`), from which the model writes the kept rows' positions (`videos.write_positions`);
without this hook they stayed in the turn's own coordinates, and the video's kept rows went to positions
up to the whole history too low. Here they move by the same shift.

A video in the session's first turn is laid out in the session's coordinates already (the shift is 0), and
the turns after a video need nothing: their text continues from the request's decode offset, which the
processor computed for the pruned prompt.

A turn's `logprob_start_len` indexes the whole session's prompt, which only the scheduler assembles, so input
logprobs over a pruned video (`refusals.prompt_logprobs_refusal`) are refused for a session turn here, once the
turn is appended to its history.
"""

import torch

from sglang_evs import sglang_compat
from sglang_evs.pruning.fields import REGION_POSITIONS, is_pruned
from sglang_evs.pruning.refusals import prompt_logprobs_refusal, serves_this_model


def move_pruned_regions_with_the_turn(upstream, req, image_inputs, *args, **kwargs):
    """AROUND hook on `Req._extend_session_image_inputs(image_inputs)`: after SGLang moved the turn's positions
    ([3, turn tokens] -> the request's [3, history + turn tokens]), the turn's pruned videos' region positions
    move by the same shift, read off the turn's first token. A turn SGLang refused already is not appended
    (`refused_turn`)."""
    if refused_turn(req):
        return None
    turn = image_inputs.mrope_positions
    result = upstream(req, image_inputs, *args, **kwargs)
    moved = req.multimodal_inputs.mrope_positions if req.multimodal_inputs is not None else None
    if turn is None or moved is None or turn.shape[1] == 0:
        return result
    shift = session_shift(turn, moved, turn_start=len(req.origin_input_ids) - turn.shape[1])
    if not bool(shift.any()):  # the session's first turn
        return result
    for item in image_inputs.mm_items:
        if is_pruned(item):  # a video or an image
            region = item.model_specific_data[REGION_POSITIONS]
            item.set(REGION_POSITIONS, region + shift.to(region.device, region.dtype))
    return result


def refused_turn(req) -> bool:
    """A session turn SGLang refused as it created it, for the models the plugin serves. The case met: a streaming
    session's next turn sent while the one before it still runs ("Streaming session already has an active request.";
    the tokenizer now queues such a turn, `stream_sessions.queue_pipelined_turn`, so this guards what else SGLang
    refuses there). SGLang 0.5.23 sets the refusal, cutting the turn's prompt to one token, then still appends the
    turn's media to the session's history, and its scheduler stops there ("upper bound and lower bound inconsistent
    with step sign", every request in flight lost). Not appended, the turn is answered with the refusal (HTTP 400)
    and the session serves on."""
    return isinstance(getattr(req, "to_finish", None), sglang_compat.FINISH_ABORT) and serves_this_model()


def session_shift(turn: torch.Tensor, moved: torch.Tensor, turn_start: int) -> torch.Tensor:
    """[3, 1]: how far SGLang moved a turn's positions (`turn` [3, n], the turn's own) to where they sit in the
    request's (`moved` [3, >= turn_start + n]), from the turn's first token."""
    return (moved[:, turn_start : turn_start + 1] - turn[:, :1]).to(torch.int64)


def refuse_session_logprobs_over_pruned_videos(scheduler, req, *args, **kwargs) -> None:
    """BEFORE hook on `Scheduler._add_request_to_queue(req)`: a session turn asking for input logprobs from before
    the end of a pruned video of its session (an earlier turn's or its own) is failed with HTTP 400 naming
    `logprob_start_len` and the setting; the session serves on. Other requests were checked by the processor."""
    if getattr(req, "session", None) is None or req.to_finish is not None or req.multimodal_inputs is None:
        return
    message = prompt_logprobs_refusal(req, req.multimodal_inputs.mm_items, len(req.origin_input_ids))
    if message is not None:
        req.set_finish_with_abort(message)
