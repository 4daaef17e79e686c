"""Scheduler side of a threshold: each waiting video's mask decided when the scheduler admits its request, and
the prompt laid out from it, before anything SGLang derives from the prompt (its radix key, its KV allocation,
its chunks, its M-RoPE decode offset).

The tokenizer laid the prompt out unpruned and marked each video (`regions.mark_threshold_videos`). Here, as
`Scheduler.handle_generate_request` receives the request, the model's `PrunedVideos.decide_threshold` runs the
vision tower on each marked video and takes its mask, and the pruned pads are deleted by the one deletion rule
(`deletion.delete_tokens`: every kept token at its unpruned position, the decode offset grown by the count
deleted). The mask stays on the item (`fields.THRESHOLD_KEPT`), so the forward takes exactly those rows.
"""

import logging
from array import array
from collections.abc import Callable

import torch

from sglang_evs import sglang_compat as sglang
from sglang_evs.pruning import holds
from sglang_evs.pruning.deletion import delete_tokens
from sglang_evs.pruning.fields import THRESHOLD, THRESHOLD_KEPT, VIDEO_TOKENS, awaits_threshold

logger = logging.getLogger(__name__)


def lay_out_by_threshold(output, decide: Callable[[object], torch.Tensor], video_token_id: int) -> None:
    """An SGLang `MultimodalProcessorOutput` laid out unpruned -> laid out by each waiting video's mask, in place.

    `decide(item)`: the video's keep-mask, [T*h*w] bool over its pads in order (the pads are the
    `video_token_id` tokens inside its spans)."""
    ids = torch.as_tensor(output.input_ids)
    keep = torch.ones(ids.numel(), dtype=torch.bool)
    for item in output.mm_items:
        if not (item.is_video() and awaits_threshold(item)):
            continue
        pads = torch.cat([start + (ids[start : end + 1] == video_token_id).nonzero().flatten()
                          for start, end in item.offsets])  # fmt: skip
        mask = decide(item)
        if mask.numel() != pads.numel():
            raise ValueError(f"a keep-mask of {mask.numel()} tokens for a video of {pads.numel()} pads")
        keep[pads] = mask
        item.set(THRESHOLD, {**item.model_specific_data[THRESHOLD], THRESHOLD_KEPT: mask})
        item.set(VIDEO_TOKENS, (mask.numel(), int(mask.sum())))
    delete_tokens(output, keep)
    output.padded_input_ids = type(output).build_padded_input_ids(output.input_ids, output.mm_items)


def lay_out_at_admission(original, scheduler, recv_req, *args, **kwargs):
    """AROUND hook on Scheduler.handle_generate_request: a request whose videos wait for their threshold is laid
    out from their masks before SGLang builds its request. Where that fails, the request is failed as SGLang fails
    a request whose media could not be processed (its multimodal inputs an `MMInputsProcessError`: aborted, the
    server serves on). Every request's media are noted in arrival order (`holds.note_arrival`)."""
    output = getattr(recv_req, "mm_inputs", None)
    items = list(getattr(output, "mm_items", None) or ())
    try:
        return _lay_out(original, scheduler, recv_req, output, items, *args, **kwargs)
    finally:
        holds.note_arrival(item for item in items if item.is_video())


def _lay_out(original, scheduler, recv_req, output, items, *args, **kwargs):
    if any(item.is_video() and awaits_threshold(item) for item in items):
        try:
            videos = scheduler.tp_worker.model_runner.model.pruned_videos
            if len(recv_req.input_ids) != len(output.input_ids):
                raise ValueError(f"{len(recv_req.input_ids)} prompt ids beside a layout of {len(output.input_ids)}")
            lay_out_by_threshold(output, videos.decide_threshold, videos.pad_token_id)
        except Exception as exc:  # noqa: BLE001 - this request fails, the scheduler serves on
            logger.exception("sglang-evs: a threshold's layout failed; request %s aborted", recv_req.rid)
            recv_req.mm_inputs = sglang.MMInputsProcessError(f"sglang-evs: video_pruning_threshold: {exc}")
            return original(scheduler, recv_req, *args, **kwargs)
        ids = recv_req.input_ids  # SGLang's own type (an array of int64) is kept
        recv_req.input_ids = array(ids.typecode, output.input_ids) if isinstance(ids, array) else list(output.input_ids)
    return original(scheduler, recv_req, *args, **kwargs)
