"""Encoder disaggregation's records: what an encoder server does to a video, and how a language server lays
out the prompt from what it recorded. Pure functions over plain types and tensors; the hooks that carry them
between the servers are `disaggregated.py`'s.

- `settings_for_encoder`: the fields one video entry carries to the encoder (method and rate);
- `kept_counts`: each video's row count once pruned, known before it is encoded;
- `prune_encoded_videos`: after the tower, each video's kept rows and its record (`video_record`: method,
  rate, kept indices), attached to the rows SGLang sends under `RECORDS`;
- `lay_out_pruned`: the unpruned prompt upstream's processor laid out -> the pruned one, by the same rule as
  one server (`deletion.delete_tokens`: unpruned positions, pruned rows deleted, decode offset grown).
"""

import torch

from sglang_evs.methods import DEFAULT_METHOD, METHODS, PRUNING_METHOD_SETTING, PRUNING_RATE_SETTING, grid_tokens
from sglang_evs.pruning.deletion import delete_tokens
from sglang_evs.pruning.fields import ENCODER_PRUNED
from sglang_evs.pruning.settings import Pruning

RECORDS = "evs_video_pruning"  # the per-video records' attribute on SGLang's EmbeddingData


def video_record(method: str, rate: float, kept: list[int] | None, tokens: int) -> dict:
    """What the encoder did to one video, in plain types (SGLang's restricted unpickler carries it):
    `kept` the indices of the kept pads in the video's [T*h*w] (None: not pruned), `tokens` its pads."""
    return {"method": method, "rate": rate, "kept": kept, "tokens": tokens}


def settings_for_encoder(pruning: Pruning) -> dict:
    """The fields one video entry carries to the encoder server."""
    return {PRUNING_METHOD_SETTING: pruning.method.name, PRUNING_RATE_SETTING: pruning.rate}


def video_pruning(setting: dict):
    """A video entry's settings (`settings_for_encoder`, {} for none) -> (its method, its rate)."""
    method = METHODS[setting.get(PRUNING_METHOD_SETTING, DEFAULT_METHOD.name)]
    return method, float(setting.get(PRUNING_RATE_SETTING) or 0.0)


def prune_encoded_videos(
    rows: torch.Tensor, grids: list, settings: list[dict], spatial_merge_size: int
) -> tuple[torch.Tensor, list[int], list[dict]]:
    """Rows [sum tokens, D] of several videos, in order (grids [T, H, W] each, settings as
    `settings_for_encoder` wrote them, {} for none) -> (the kept rows, each video's kept count, records)."""
    kept_rows, counts, records = [], [], []
    start = 0
    for grid, setting in zip(grids, settings, strict=True):
        t, h, w = grid_tokens(grid, spatial_merge_size)
        video = rows[start : start + t * h * w]
        start += t * h * w
        method, rate = video_pruning(setting)
        if rate <= 0:
            kept_rows.append(video)
            counts.append(t * h * w)
            records.append(video_record(method.name, 0.0, None, t * h * w))
            continue
        mask = method.retention_mask(video, grid, spatial_merge_size, rate)
        kept_rows.append(video[mask])
        counts.append(int(mask.sum()))
        records.append(video_record(method.name, rate, mask.nonzero().flatten().tolist(), t * h * w))
    if start != rows.shape[0]:
        raise ValueError(f"{rows.shape[0]} encoded rows for videos of {start} tokens")
    return torch.cat(kept_rows) if kept_rows else rows, counts, records


def lay_out_pruned(output, records: list[dict], video_rows: torch.Tensor, video_token_id: int):
    """Upstream's processor output for the unpruned prompt (its video items over stand-in rows) -> the
    pruned prompt: each video's pruned pads deleted from the ids, the M-RoPE positions and the items'
    spans, the decode offset grown by their count, and the received kept rows [sum kept, D] placed in
    the video items, in order. Records: `video_record`s, one per video in prompt order.

    A video's pads are the `video_token_id` tokens inside its items' spans, and an item may have several
    spans (GLM writes a video's rows with its image token, one span per temporal group): an image's pads
    are never taken for a video's, even where the two share a token id.

    Each video item is marked with the request's method and rate (`fields.ENCODER_PRUNED`; one request has
    one setting): a prefill server of a PD pair sends them in its layout, and its decode server, which lays
    the same prompt out with its own pruning processor and never sees these records, compares them with its
    own (`prefill_decode.layout_of`)."""
    ids = torch.as_tensor(output.input_ids)
    in_video = torch.zeros_like(ids, dtype=torch.bool)
    for item in output.mm_items:
        for start, end in item.offsets if item.is_video() else ():
            in_video[start : end + 1] = True
    is_pad = in_video & (ids == video_token_id)
    pads = is_pad.nonzero().flatten()
    masks = []
    for record in records:
        mask = torch.ones(record["tokens"], dtype=torch.bool)
        if record["kept"] is not None:
            mask[:] = False
            mask[list(record["kept"])] = True
        masks.append(mask)
    pad_mask = torch.cat(masks) if masks else torch.ones(0, dtype=torch.bool)
    if pad_mask.numel() != pads.numel():
        raise ValueError(f"the prompt has {pads.numel()} video pads, the encoder's records {pad_mask.numel()}")
    if int(pad_mask.sum()) != video_rows.shape[0]:
        raise ValueError(f"{video_rows.shape[0]} video rows received for {int(pad_mask.sum())} kept pads")
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[pads] = pad_mask
    kept_pad = keep & is_pad
    pruned = [record for record in records if record["kept"] is not None]
    setting = {"method": pruned[0]["method"], "rate": pruned[0]["rate"]} if pruned else None
    consumed = 0
    for item in output.mm_items:
        if item.is_video():
            kept_pads = sum(int(kept_pad[start : end + 1].sum()) for start, end in item.offsets)
            item.precomputed_embeddings = video_rows[consumed : consumed + kept_pads]
            consumed += kept_pads
            if setting is not None:
                item.model_specific_data[ENCODER_PRUNED] = dict(setting)
    delete_tokens(output, keep)
    return output


def kept_counts(grids: list, settings: list[dict], spatial_merge_size: int) -> list[int]:
    """Each video's row count once pruned: known from its grid, method and rate before it is encoded."""
    counts = []
    for grid, setting in zip(grids, settings, strict=True):
        t, h, w = grid_tokens(grid, spatial_merge_size)
        method, rate = video_pruning(setting)
        counts.append(method.retained_token_count(h * w, t, rate) if rate > 0 else t * h * w)
    return counts
