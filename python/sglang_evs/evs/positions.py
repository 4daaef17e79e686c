"""M-RoPE positions of a request whose videos are pruned by EVS.

Reference (spec sections 3-4): compute the Qwen3-VL positions of the unpruned
sequence and delete the rows of the pruned pad tokens; the decode offset is
the unpruned ``mrope_position_delta`` plus the number of pruned tokens.

Unpruned positions, as in Qwen3-VL / SGLang ``get_rope_index``: every image,
and every temporal group of a video, is one *grid block* of ``t x h x w``
merged tokens (video groups have ``t = 1``).  Text (everything that is not a
pad, markers and timestamps included) takes consecutive positions ``p, p+1,
...`` in all three rows.  A block whose first pad would be at position ``b``
gives cell ``(i, r, c)`` the position ``(b + i, b + r, b + c)``, and the next
text continues at ``b + max(t, h, w)``.

A request is described compactly by :class:`RequestLayout` (one row per
block, parsed once from the unpruned expanded ``input_ids``) and, once the
keep-masks are known, by :class:`PositionPlan`: a table of ``2B + 1``
segments of the *pruned* sequence (text run, block, text run, ..., block,
text run) with their start offsets and base positions, plus the kept cells
of pruned blocks.  Positions of any window ``[start, end)`` are then computed
by ``searchsorted`` over the segment starts and a few gathers: cost linear in
the window plus ``log`` of the number of segments, no loop over tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

__all__ = [
    "PositionPlan",
    "RequestLayout",
    "build_position_plan",
    "parse_request_layout",
    "pruned_mrope_positions",
]

KeepMasks = Sequence[torch.Tensor | None] | Mapping[int, torch.Tensor | None]


@dataclass(frozen=True)
class RequestLayout:
    """Where the grid blocks of one request sit in its *unpruned* sequence.

    Attributes:
        seq_len: unpruned sequence length.
        block_start: ``[B]`` int64, offset of each block's first pad, increasing.
        block_thw: ``[B, 3]`` int64 merged grid ``(t, h, w)`` of each block.
        block_video: ``[B]`` int64 video index (order of ``video_grid_thw``),
            ``-1`` for images.
        block_group: ``[B]`` int64 temporal group inside the video (0 for images).
    """

    seq_len: int
    block_start: torch.Tensor
    block_thw: torch.Tensor
    block_video: torch.Tensor
    block_group: torch.Tensor

    @property
    def num_videos(self) -> int:
        return int(self.block_video.max()) + 1 if self.block_video.numel() else 0


def _media_blocks(
    ids: torch.Tensor,
    grid_thw: torch.Tensor | Sequence[Sequence[int]] | None,
    merge: int,
    token_id: int,
    is_video: bool,
) -> tuple[torch.Tensor, ...]:
    """Blocks of one modality: (start, thw, video, group), in media order."""
    grid = torch.as_tensor([] if grid_thw is None else grid_thw, dtype=torch.long).reshape(-1, 3).cpu()
    if (grid[:, 1:] % merge).any() or (grid < 1).any():
        raise ValueError(f"grids {grid.tolist()} not divisible by merge size {merge}")
    thw = torch.stack([grid[:, 0], grid[:, 1] // merge, grid[:, 2] // merge], 1)
    media = torch.arange(len(grid))
    group = torch.zeros(len(grid), dtype=torch.long)
    if is_video:  # each temporal group is its own t = 1 block
        groups = thw[:, 0]
        media = torch.repeat_interleave(media, groups)
        thw = torch.repeat_interleave(thw, groups, dim=0)
        thw[:, 0] = 1
        first = torch.cumsum(groups, 0) - groups
        group = torch.arange(len(media)) - torch.repeat_interleave(first, groups)
    sizes = thw.prod(dim=1)
    where = torch.nonzero(ids == token_id).squeeze(1)
    if where.numel() != int(sizes.sum()):
        kind = "video" if is_video else "image"
        raise ValueError(f"{where.numel()} {kind} pad tokens (id {token_id}) but the grids need {int(sizes.sum())}")
    first_pad = torch.cumsum(sizes, 0) - sizes
    start = where[first_pad]
    if (where[first_pad + sizes - 1] - start != sizes - 1).any():
        raise ValueError("a media block's pad tokens are not contiguous")
    return start, thw, media if is_video else torch.full_like(media, -1), group


def parse_request_layout(
    input_ids: torch.Tensor | Sequence[int],
    image_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None,
    video_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None,
    spatial_merge_size: int,
    image_token_id: int,
    video_token_id: int,
) -> RequestLayout:
    """Locate every block in the unpruned expanded prompt.

    Args:
        input_ids: ``[L]`` unpruned ids (``tpf`` video pads per group).
        image_grid_thw: ``[I, 3]`` grids before merging, in prompt order.
        video_grid_thw: ``[V, 3]`` grids before merging, in prompt order.

    Pads of one kind are assigned to media in order (``t * h * w`` per image,
    ``h * w`` per video group), so markers are not needed; each block's pads
    must be contiguous.
    """
    ids = torch.as_tensor(input_ids).reshape(-1).cpu()
    m = int(spatial_merge_size)
    parts = [
        _media_blocks(ids, image_grid_thw, m, image_token_id, False),
        _media_blocks(ids, video_grid_thw, m, video_token_id, True),
    ]
    start, thw, video, group = (torch.cat(x) for x in zip(*parts, strict=True))
    order = torch.argsort(start)
    return RequestLayout(ids.numel(), start[order], thw[order], video[order], group[order])


@dataclass(frozen=True)
class PositionPlan:
    """Pruned sequence of one request as ``2B + 1`` segments.

    Segment ``2i`` is text run ``i``, segment ``2i + 1`` is block ``i``.

    Attributes:
        seq_len: pruned sequence length ``L``.
        mrope_position_delta: decode offset (position of token ``j >= L`` is
            ``j + delta`` in all three rows).
        seg_start: ``[S]`` offset of each segment in the pruned sequence.
        seg_base: ``[S]`` first text position, or block base ``b``.
        seg_is_text: ``[S]`` bool.
        seg_hw, seg_w: ``[S]`` ``h * w`` and ``w`` of blocks (1 for text).
        seg_ptr: ``[S]`` offset of a pruned block's cells in ``kept_cells``,
            ``-1`` for text and whole blocks.
        kept_cells: ``[K + 1]`` flat cell index ``r * w + c`` of each kept
            token of each pruned block (one trailing dummy).
        block_unpruned_start: ``[B]`` block offsets in the unpruned sequence.
        kept_unpruned_index: ``[K]`` unpruned offset of each ``kept_cells`` entry.
        unpruned_len: unpruned sequence length.
    """

    seq_len: int
    mrope_position_delta: int
    seg_start: torch.Tensor
    seg_base: torch.Tensor
    seg_is_text: torch.Tensor
    seg_hw: torch.Tensor
    seg_w: torch.Tensor
    seg_ptr: torch.Tensor
    kept_cells: torch.Tensor
    block_unpruned_start: torch.Tensor
    kept_unpruned_index: torch.Tensor
    unpruned_len: int

    @property
    def block_start(self) -> torch.Tensor:
        """``[B]`` offset of each block's first kept pad in the pruned sequence."""
        return self.seg_start[1::2]

    @property
    def block_len(self) -> torch.Tensor:
        """``[B]`` kept tokens of each block."""
        return self.seg_start[2::2] - self.seg_start[1::2]

    def to(self, device: torch.device | str) -> PositionPlan:
        """Copy of the plan with its tensors on ``device``."""
        moved = {k: v.to(device) for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)}
        return replace(self, **moved)

    def positions(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """``[3, end - start]`` int64 positions of pruned tokens ``[start, end)``."""
        end = self.seq_len if end is None else int(end)
        if not 0 <= start <= end <= self.seq_len:
            raise ValueError(f"window [{start}, {end}) outside [0, {self.seq_len})")
        idx = torch.arange(start, end, device=self.seg_start.device)
        seg = torch.searchsorted(self.seg_start, idx, right=True) - 1
        off = idx - self.seg_start[seg]
        ptr = self.seg_ptr[seg]
        cell = torch.where(ptr >= 0, self.kept_cells[torch.where(ptr >= 0, ptr + off, 0)], off)
        hw, w, base = self.seg_hw[seg], self.seg_w[seg], self.seg_base[seg]
        grid = torch.stack([cell // hw, cell % hw // w, cell % w]) + base
        return torch.where(self.seg_is_text[seg], base + off, grid)

    def kept_indices(self) -> torch.Tensor:
        """``[L]`` unpruned offset of every token of the pruned sequence."""
        n = self.unpruned_len
        pruned = self.seg_ptr[1::2] >= 0
        sizes = self.seg_hw[1::2]  # pruned blocks are video groups, t = 1
        edges = torch.zeros(n + 1, dtype=torch.long, device=self.seg_start.device)
        starts = self.block_unpruned_start[pruned]
        edges.index_add_(0, starts, torch.ones_like(starts))
        edges.index_add_(0, starts + sizes[pruned], -torch.ones_like(starts))
        keep = torch.cumsum(edges[:n], 0) == 0
        keep[self.kept_unpruned_index] = True
        return torch.nonzero(keep).squeeze(1)


def _masks_by_video(keep_masks: KeepMasks | None, num_videos: int) -> dict[int, torch.Tensor]:
    if keep_masks is None:
        return {}
    items = keep_masks.items() if isinstance(keep_masks, Mapping) else enumerate(keep_masks)
    out = {int(v): m for v, m in items if m is not None}
    if any(not 0 <= v < num_videos for v in out):
        raise ValueError(f"keep-mask for unknown video, videos: {num_videos}")
    return out


def build_position_plan(layout: RequestLayout, keep_masks: KeepMasks | None = None) -> PositionPlan:
    """Plan of the pruned request.

    Args:
        layout: from :func:`parse_request_layout`.
        keep_masks: per video index, a ``[T * h * w]`` bool keep-mask (any
            mask, not only EVS ones), or ``None`` for an unpruned video.

    Cost: ``O(B + kept tokens of pruned videos)``.
    """
    thw, starts = layout.block_thw, layout.block_start
    b = starts.numel()
    sizes = thw.prod(dim=1)
    kept = sizes.clone()
    ptr = torch.full((b,), -1, dtype=torch.long)
    cells, abs_index = (
        [torch.zeros(0, dtype=torch.long)],
        [torch.zeros(0, dtype=torch.long)],
    )
    offset = 0
    for v, mask in sorted(_masks_by_video(keep_masks, layout.num_videos).items()):
        blocks = torch.nonzero(layout.block_video == v).squeeze(1)
        blocks = blocks[torch.argsort(layout.block_group[blocks])]
        tpf = int(sizes[blocks[0]])
        mask = torch.as_tensor(mask).reshape(-1).bool().cpu()
        if mask.numel() != blocks.numel() * tpf:
            raise ValueError(f"keep-mask of video {v} has {mask.numel()} entries, expected {blocks.numel() * tpf}")
        flat = torch.nonzero(mask).squeeze(1)
        counts = mask.view(-1, tpf).sum(dim=1)
        kept[blocks] = counts
        ptr[blocks] = offset + torch.cumsum(counts, 0) - counts
        cells.append(flat % tpf)
        abs_index.append(starts[blocks][flat // tpf] + flat % tpf)
        offset += flat.numel()

    ends = starts + sizes
    text = torch.diff(
        starts,
        prepend=torch.zeros(1, dtype=torch.long),
        append=torch.tensor([layout.seq_len]),
    )
    text[1:] -= sizes  # text run i = gap between block i-1's end and block i
    if (text < 0).any() or (b and int(ends[-1]) > layout.seq_len):
        raise ValueError("blocks overlap or exceed the sequence")
    extent = thw.max(dim=1).values
    text_pos = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(text[:b] + extent, 0)])
    block_base = text_pos[:b] + text[:b]

    seg_len = torch.stack([text[:b], kept], 1).reshape(-1)
    seg_len = torch.cat([seg_len, text[b:]])
    seg_start = torch.cumsum(seg_len, 0) - seg_len
    seq_len = int(seg_len.sum())
    seg_base = torch.cat([torch.stack([text_pos[:b], block_base], 1).reshape(-1), text_pos[b:]])
    is_text = torch.arange(2 * b + 1) % 2 == 0
    ones = torch.ones(2 * b + 1, dtype=torch.long)
    seg_hw, seg_w, seg_ptr = ones.clone(), ones.clone(), -ones
    seg_hw[1::2] = thw[:, 1] * thw[:, 2]
    seg_w[1::2] = thw[:, 2]
    seg_ptr[1::2] = ptr
    final_position = int(text_pos[b] + text[b])  # unpruned max position + 1
    return PositionPlan(
        seq_len=seq_len,
        mrope_position_delta=final_position - seq_len,
        seg_start=seg_start,
        seg_base=seg_base,
        seg_is_text=is_text,
        seg_hw=seg_hw,
        seg_w=seg_w,
        seg_ptr=seg_ptr,
        kept_cells=torch.cat(cells + [torch.zeros(1, dtype=torch.long)]),
        block_unpruned_start=starts,
        kept_unpruned_index=torch.cat(abs_index),
        unpruned_len=layout.seq_len,
    )


def pruned_mrope_positions(
    input_ids: torch.Tensor | Sequence[int],
    image_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None,
    video_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None,
    spatial_merge_size: int,
    image_token_id: int,
    video_token_id: int,
    keep_masks: KeepMasks | None = None,
) -> tuple[torch.Tensor, int]:
    """``([3, L] positions, mrope_position_delta)`` of the pruned request.

    ``input_ids`` is the *unpruned* expanded prompt; ``L`` is the pruned
    length.  With no masks this equals SGLang's ``get_rope_index`` for
    ``model_type="qwen3_vl"``.
    """
    layout = parse_request_layout(
        input_ids,
        image_grid_thw,
        video_grid_thw,
        spatial_merge_size,
        image_token_id,
        video_token_id,
    )
    plan = build_position_plan(layout, keep_masks)
    return plan.positions(), plan.mrope_position_delta
