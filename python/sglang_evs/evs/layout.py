"""Qwen3-VL video layout in the prompt under EVS pruning.

Unpruned, Qwen3-VL expands a video of ``T`` temporal groups (``tpf = h * w``
merged tokens each) to, for ``g = 0 .. T-1``::

    <ts_g> <|vision_start|> <|video_pad|> * tpf <|vision_end|>

where ``<ts_g>`` is the tokenized text ``<{t:.1f} seconds>`` of group ``g``
(tokenized per group).  The chat template may add its own outer
``<|vision_start|> ... <|vision_end|>`` around the whole expansion; that is
ordinary text here.

Pruned layout (what this package implements)
--------------------------------------------
Every group keeps its own framing, and the pads under group ``g`` are exactly
the ``k_g`` kept tokens of group ``g`` (in raster order)::

    <ts_g> <|vision_start|> <|video_pad|> * k_g <|vision_end|>

This is literally the unpruned sequence with the pruned pad tokens deleted,
so with the M-RoPE positions of ``positions.py`` the language model sees
exactly the reference of spec section 4: same tokens, same order (hence the
same causal attention pattern), same positions, each kept token under its own
timestamp.  Its length ``sum(len(ts_g)) + 2 T + N`` does not depend on the
mask, because ``N = sum(k_g)`` depends only on the grid and the rate
(:func:`pruned_placeholder_length`).  Only the split of ``N`` over groups
``1..T-1`` depends on the mask.  Group 0 is always whole, so its part of the
expansion (``<ts_0> vs pad*tpf ve``) is fixed.

Before the encoder runs the prompt is therefore built with the *canonical*
split (:func:`canonical_kept_per_group`: group 0 whole, ``N - tpf`` spread
evenly over groups 1..T-1), which has the right length and the right tokens,
only possibly not the right order inside the part after group 0.  After the
encoder the true split is known and :func:`pruned_video_slots` says, for every
slot of the expansion, which framing token id or which kept encoder row goes
there.  The expansion (at least from ``<ts_1>`` to the last
``<|vision_end|>``) must thus be one embedding region filled after encoding:
framing slots get the text embedding of their token id, pad slots their kept
row.  The length, the text before and after the video and their positions
never depend on the mask, so prompt length, scheduling and prefix caching
(keyed by the hashed region) are unaffected.

Recipe (per request; ``positions.py`` holds the request-level helpers):

1. tokenizer side, before encoding: ``layout = parse_request_layout(unpruned
   ids, grids, ...)``; ``canon = build_position_plan(layout, {v:
   canonical_keep_mask(grid_v, m, q)})``; prompt ids ``=
   unpruned_ids[canon.kept_indices()]`` (length final).
2. after the encoder: ``mask_v = retention_mask(...)``; ``plan =
   build_position_plan(layout, {v: mask_v})``; ``pruned_video_slots(ts_v,
   mask_v, ...)`` fills each video's region; ``plan.positions(start, end)``
   gives any chunk's positions, ``plan.mrope_position_delta`` the decode
   offset.  Outside the video regions ``canon`` and ``plan`` agree.

Alternative considered and rejected: fixed token ids with all ``N - tpf``
extra pads in one run (vLLM puts them under group 0) and only the *positions*
of pad slots permuted.  Positions then form a permutation of the reference,
not the reference: a kept token of group 5 would precede the timestamps of
groups 1..5 in the sequence and could not attend to them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .selection import GridTHW, grid_tokens, retained_token_count

__all__ = [
    "canonical_keep_mask",
    "canonical_kept_per_group",
    "group_timestamps",
    "kept_cells",
    "kept_per_group",
    "pruned_placeholder_length",
    "pruned_video_slots",
    "timestamp_text",
    "video_token_ids",
]

# slot kinds inside one video expansion
_TS, _START, _PAD, _END = 0, 1, 2, 3


def group_timestamps(
    frame_indices: Sequence[int] | torch.Tensor,
    fps: float,
    temporal_patch_size: int = 2,
) -> list[float]:
    """Seconds of each temporal group: mean of its first and last frame time.

    Frame time is ``index / fps``; an odd count repeats the last index.
    Returns ``ceil(len(frame_indices) / temporal_patch_size)`` floats.
    """
    idx = [int(i) for i in frame_indices]
    p = int(temporal_patch_size)
    if not idx or p < 1 or not fps > 0:
        raise ValueError(
            f"need frame indices, temporal_patch_size >= 1 and fps > 0, got {len(idx)} indices, {p}, {fps!r}"
        )
    idx += [idx[-1]] * (-len(idx) % p)
    times = (torch.tensor(idx, dtype=torch.float64) / fps).view(-1, p)
    return ((times[:, 0] + times[:, -1]) / 2).tolist()


def timestamp_text(seconds: float) -> str:
    """The per-group timestamp text Qwen3-VL puts before ``<|vision_start|>``."""
    return f"<{seconds:.1f} seconds>"


def pruned_placeholder_length(timestamp_lengths: Sequence[int], tokens_per_group: int, pruning_rate: float) -> int:
    """Length of a pruned video's expansion: ``sum(ts) + 2 T + N``.

    ``timestamp_lengths[g]`` is the token count of group ``g``'s timestamp
    text; ``T = len(timestamp_lengths)``.  Independent of the keep-mask.
    """
    t = len(timestamp_lengths)
    n = retained_token_count(tokens_per_group, t, pruning_rate)
    return int(sum(timestamp_lengths)) + 2 * t + n


def kept_per_group(keep_mask: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``[T * tpf]`` bool mask -> ``[T]`` int64 kept count of each group."""
    return keep_mask.reshape(int(num_groups), -1).sum(dim=1)


def canonical_kept_per_group(tokens_per_group: int, num_groups: int, pruning_rate: float) -> torch.Tensor:
    """Mask-independent split used before encoding, ``[T]`` int64.

    Group 0 keeps ``tpf``; the other ``N - tpf`` are spread evenly over groups
    ``1..T-1``, the remainder going to the earliest groups.
    """
    tpf, t = int(tokens_per_group), int(num_groups)
    rest = retained_token_count(tpf, t, pruning_rate) - tpf
    counts = torch.full((t,), tpf, dtype=torch.long)
    if t > 1:
        g = torch.arange(t - 1)
        counts[1:] = rest // (t - 1) + (g < rest % (t - 1)).long()
    return counts


def canonical_keep_mask(grid_thw: GridTHW, spatial_merge_size: int, pruning_rate: float) -> torch.Tensor:
    """``[T * h * w]`` mask with the canonical split, first cells of each group."""
    t, h, w = grid_tokens(grid_thw, spatial_merge_size)
    counts = canonical_kept_per_group(h * w, t, pruning_rate)
    return (torch.arange(h * w)[None, :] < counts[:, None]).reshape(-1)


def kept_cells(keep_mask: torch.Tensor, grid_thw: GridTHW, spatial_merge_size: int) -> torch.Tensor:
    """``[N, 3]`` int64 ``(group, row, col)`` of the kept tokens, in order.

    Row ``i`` describes the token that fills the ``i``-th pad slot of the
    pruned expansion (pad slots are filled with the kept rows in order).
    """
    t, h, w = grid_tokens(grid_thw, spatial_merge_size)
    if keep_mask.numel() != t * h * w:
        raise ValueError(f"keep_mask has {keep_mask.numel()} entries, grid {t * h * w}")
    flat = torch.nonzero(keep_mask.reshape(-1)).squeeze(1)
    return torch.stack([flat // (h * w), flat % (h * w) // w, flat % w], dim=1)


def _slot_kinds(
    timestamp_token_ids: Sequence[Sequence[int]], counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot kinds of an expansion and the flat timestamp ids, both int64."""
    t = len(timestamp_token_ids)
    if counts.numel() != t:
        raise ValueError(f"{counts.numel()} group counts for {t} timestamps")
    ts_len = torch.tensor([len(x) for x in timestamp_token_ids], dtype=torch.long)
    ones = torch.ones(t, dtype=torch.long)
    pieces = torch.stack([ts_len, ones, counts.to(torch.long).cpu(), ones], 1)
    kinds = torch.tensor([_TS, _START, _PAD, _END]).repeat(t)
    flat_ts = torch.tensor([i for ids in timestamp_token_ids for i in ids], dtype=torch.long)
    return torch.repeat_interleave(kinds, pieces.reshape(-1)), flat_ts


def _expansion(
    timestamp_token_ids: Sequence[Sequence[int]],
    counts: torch.Tensor,
    ids_by_kind: tuple[int, int, int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and slot kinds of an expansion with ``counts`` pads per group."""
    kinds, flat_ts = _slot_kinds(timestamp_token_ids, counts)
    ids = torch.empty_like(kinds)
    ids[kinds == _TS] = flat_ts
    for kind, token_id in zip((_START, _PAD, _END), ids_by_kind, strict=True):
        ids[kinds == kind] = int(token_id)
    return ids, kinds


def video_token_ids(
    timestamp_token_ids: Sequence[Sequence[int]],
    kept_per_group: Sequence[int] | torch.Tensor,
    vision_start_id: int,
    vision_end_id: int,
    video_pad_id: int,
) -> torch.Tensor:
    """Token ids of one pruned video expansion, ``[sum(ts) + 2 T + N]`` int64.

    ``timestamp_token_ids[g]`` are group ``g``'s timestamp token ids and
    ``kept_per_group[g]`` its pad count: the canonical split
    (:func:`canonical_kept_per_group`) before encoding, the mask's
    (:func:`kept_per_group`) after.
    """
    counts = torch.as_tensor(kept_per_group, dtype=torch.long)
    special = (vision_start_id, video_pad_id, vision_end_id)
    return _expansion(timestamp_token_ids, counts, special)[0]


def pruned_video_slots(
    timestamp_token_ids: Sequence[Sequence[int]],
    keep_mask: torch.Tensor,
    vision_start_id: int,
    vision_end_id: int,
    video_pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What fills each slot of a pruned video expansion once the mask is known.

    Args:
        timestamp_token_ids: ``T`` lists of timestamp token ids.
        keep_mask: ``[T * tpf]`` bool EVS mask of the video.

    Returns:
        ``(token_ids, rows)``, both ``[sum(ts) + 2 T + N]`` int64:
        ``token_ids`` of the true layout (framing ids; ``video_pad_id`` on pad
        slots) and ``rows``, the original encoder row (``g * tpf + r * w + c``)
        placed on each pad slot, ``-1`` on framing slots.
    """
    t = len(timestamp_token_ids)
    mask = keep_mask.reshape(-1).cpu()
    special = (vision_start_id, video_pad_id, vision_end_id)
    ids, kinds = _expansion(timestamp_token_ids, kept_per_group(mask, t), special)
    rows = torch.full_like(ids, -1)
    rows[kinds == _PAD] = torch.nonzero(mask).squeeze(1)
    return ids, rows
