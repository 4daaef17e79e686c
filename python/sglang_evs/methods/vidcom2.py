"""VidCom2 (Liu et al., "Video Compression Commander", arXiv 2505.14454): which video tokens to keep.

Same input as EVS: one video's merged vision rows ``[T * tpf, D]``, frame
(temporal group) by frame, row-major, ``tpf = (H / m) * (W / m)``; the same
pruning rate ``q`` (vLLM's ``video_pruning_rate``; the paper's retention
ratio is ``1 - q``).

1. Score on the lowest-variance half of the channels (variance over all rows).
2. L2-normalise each row; centres: the whole video's mean and each frame's mean.
3. Similarity of a row = ``G(row, video centre) + G(row, frame centre)`` with
   ``G(x, c) = sum over alpha in {1/8, 1/4, 1/2, 1, 2} of exp(-|x - c|^2 / (2 alpha))``;
   a high similarity is redundant.
4. Frame budgets: frames far from the video centre get more.  With
   ``s_t = -mean(G(frame t rows, video centre))`` and ``p = softmax(s / 0.01)``,
   ``k_t = round(tpf * min(1, (1 - q) * (1 + p_t - mean(p))))`` clamped to ``[1, tpf]``.
5. Each frame keeps its ``k_t`` least similar rows; then the most similar kept
   rows are dropped, or the least similar others added, until exactly
   :func:`retained_token_count` rows are kept.

Everything runs in the rows' dtype.  Selections use ``torch.topk``, so exact
ties (frequent in bf16) are broken as ``torch.topk`` breaks them on the
device at hand; the kept count is exact whatever the ties.  The result
equals vLLM 0.33's ``video_prune/vidcom2.py`` bit for bit (tested against the
released wheel).

Another count than the rate's (a token budget or a per-group floor, :mod:`.limits`):
:func:`mask_for_count`, the same steps with the budgets' share taken from that count.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .inputs import GridTHW, check_pruning_rate, check_video_rows

__all__ = ["mask_for_count", "ranking", "retained_token_count", "retention_mask"]

ALPHAS = (0.125, 0.25, 0.5, 1.0, 2.0)  # Gaussian bandwidths
TEMPERATURE = 0.01  # of the softmax over frame distinctiveness
CHANNEL_FRACTION = 0.5  # lowest-variance channels scored


def retained_token_count(tokens_per_frame: int, num_frames: int, pruning_rate: float) -> int:
    """Rows VidCom2 keeps: ``max(T, min(int(T * tpf * (1 - q)), T * tpf))``, never fewer than ``T``."""
    q = check_pruning_rate(pruning_rate)
    tpf, t = int(tokens_per_frame), int(num_frames)
    if tpf < 1 or t < 1:
        raise ValueError(f"tokens_per_frame and num_frames must be >= 1, got {tpf}, {t}")
    return max(t, min(int(t * tpf * (1 - q)), t * tpf))


def _similarity(x: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
    """Multi-scale Gaussian kernel: ``[T, tpf, C]`` rows, broadcastable centre -> ``[T, tpf]``."""
    dist2 = ((x - centre) ** 2).sum(dim=-1)
    return sum(torch.exp(-dist2 / (2.0 * alpha)) for alpha in ALPHAS)  # type: ignore[return-value]


def retention_mask(
    video_embeds: torch.Tensor,
    grid_thw: GridTHW,
    spatial_merge_size: int,
    pruning_rate: float,
) -> torch.Tensor:
    """VidCom2 keep-mask of one video.

    Args:
        video_embeds: ``[T * h * w, D]`` merged vision rows.
        grid_thw: ``(T, H, W)`` before merging; ``h = H / m``, ``w = W / m``.
        spatial_merge_size: ``m``.
        pruning_rate: ``q`` in ``[0, 1)``.

    Returns:
        ``[T * h * w]`` bool on ``video_embeds.device`` with exactly
        :func:`retained_token_count` ``(h * w, T, q)`` entries True.  Every frame's
        budget is at least 1, but the final count adjustment may still empty a frame.
    """
    t, h, w = check_video_rows(video_embeds, grid_thw, spatial_merge_size)
    target = retained_token_count(h * w, t, pruning_rate)
    q = check_pruning_rate(pruning_rate)
    return _select(*_similarities(video_embeds, t, h * w), 1.0 - q, target)


def mask_for_count(video_embeds: torch.Tensor, grid_thw: GridTHW, spatial_merge_size: int, kept: int) -> torch.Tensor:
    """VidCom2 run for another count than a rate's (a token budget or a per-group floor, :mod:`.limits`):
    the frame budgets of step 4 from the share ``kept / (T * h * w)`` in place of ``1 - q``, and step 5
    adjusts to exactly ``kept`` rows, ``0 <= kept <= T * h * w``. Shapes as :func:`retention_mask`."""
    t, h, w = check_video_rows(video_embeds, grid_thw, spatial_merge_size)
    if not 0 <= int(kept) <= t * h * w:
        raise ValueError(f"kept must be in [0, {t * h * w}], got {kept}")
    return _select(*_similarities(video_embeds, t, h * w), int(kept) / (t * h * w), int(kept))


def ranking(video_embeds: torch.Tensor, grid_thw: GridTHW, spatial_merge_size: int) -> torch.Tensor:
    """``[T * h * w]`` scores, higher kept first: minus the similarity of step 3 (VidCom2 keeps the least
    similar rows of a frame, and step 5 adds or drops by the same similarity across frames)."""
    t, h, w = check_video_rows(video_embeds, grid_thw, spatial_merge_size)
    similarity, _ = _similarities(video_embeds, t, h * w)
    return -similarity.reshape(-1)


def _similarities(video_embeds: torch.Tensor, t: int, tpf: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-3: ``[T, tpf]`` similarity of every row to its video and its frame, and ``[T, tpf]`` its
    similarity to the video alone."""
    variance = video_embeds.var(dim=0, unbiased=False)
    channels = torch.topk(variance, k=max(1, int(video_embeds.shape[1] * CHANNEL_FRACTION)), largest=False).indices
    x = F.normalize(video_embeds.index_select(1, channels).view(t, tpf, -1), dim=-1)
    to_video = _similarity(x, x.mean(dim=(0, 1), keepdim=True))
    return to_video + _similarity(x, x.mean(dim=1, keepdim=True)), to_video


def _select(similarity: torch.Tensor, to_video: torch.Tensor, retention: float, target: int) -> torch.Tensor:
    """Steps 4-5: ``[T * tpf]`` bool, ``target`` rows kept, frame budgets from the ``retention`` share."""
    t, tpf = similarity.shape
    # 4: per-frame budgets
    distinct = -to_video.mean(dim=-1)  # [T]
    p = F.softmax((distinct - distinct.max()) / TEMPERATURE, dim=0)
    share = (retention * (1.0 + p - p.mean())).clamp(max=1.0)
    budgets = (share * tpf).round().long().clamp(min=1, max=tpf).tolist()

    # 5: least similar rows of each frame, then the exact count
    mask = torch.zeros(t, tpf, dtype=torch.bool, device=similarity.device)
    for frame, k in enumerate(budgets):
        mask[frame, torch.topk(similarity[frame], k=k, largest=False, sorted=False).indices] = True
    mask, flat = mask.view(-1), similarity.view(-1)
    surplus = sum(budgets) - target
    if surplus > 0:
        kept = mask.nonzero().squeeze(1)
        mask[kept[torch.topk(flat[kept], k=surplus, largest=True, sorted=False).indices]] = False
    elif surplus < 0:
        free = (~mask).nonzero().squeeze(1)
        mask[free[torch.topk(flat[free], k=-surplus, largest=False, sorted=False).indices]] = True
    return mask
