"""Model side of video pruning: encode, keep-mask, fill the pruned regions, exact positions per forward.

A model adapter owns one `PrunedVideos` and routes two things through it:
  - `get_video_feature(items)` -> `PrunedVideos.features(items)`: the batch's videos go
    through the model's own vision tower together (in groups bounded by
    `encoder_patch_budget`), one keep-mask per pruned video is computed on the rows the
    tower returned by the item's method (every column, so deepstack levels score too), and a pruned video comes
    back as its filled region: kept rows at the pad slots, the text embedding of any framing
    tokens between groups (zero in the extra columns) elsewhere;
  - its `post_process` calls `write_positions(layout, positions)` for the positions the
    language model will read.
The tokenizer side (`regions.py`) laid the region out and left its unpruned ids and positions
on the item (`fields.py`).

Each video is encoded once per request: what the getter returns for an item is held under its key until the chunk
that covers the request's last video has run (`holds.py`), and each video's keep-mask is decided once, by its
first encode, and remembered by its key (`masks`): a later encode of the same video (past the holds' bound, a
radix repeat, `keep_mask` after the mask was forgotten) prunes by it, never by a mask of its own, so every chunk
and every repeat of one video sees the same kept rows and positions, whatever batch the tower ran it in.

A video pruned by a threshold is decided earlier, when the scheduler admits its request
(`admission.py` calls `decide_threshold`): its mask goes on the item, the prompt is laid out from it,
and its kept rows are held for its forwards (encoded again there, the item's mask applied, only where the
holds' bound left no room).

Under tensor parallelism every rank of a batch computes the masks, and rank 0's are broadcast to the
others (`agreed_masks`): a score tie broken differently on two ranks (their vision outputs may
differ in the last bit) would otherwise give them different kept rows and positions.
"""

import copy
import os
import time
from collections import OrderedDict
from collections.abc import Callable

import torch

from sglang_evs import sglang_compat as sglang
from sglang_evs import trace
from sglang_evs.methods import (
    METHODS,
    continued_mask,
    continued_threshold_mask,
    limited_mask,
    threshold_limited_mask,
    with_context,
)
from sglang_evs.methods.stream import CONTEXT_GROUPS
from sglang_evs.multimodal.contract import BatchLayout
from sglang_evs.pruning.fields import (
    METHOD,
    RATE,
    REGION_IDS,
    REGION_POSITIONS,
    STREAM_CONTEXT,
    THRESHOLD,
    THRESHOLD_KEPT,
    continues_stream,
    encoder_patches,
    is_pruned,
    pruned_limits,
    region_keep,
    region_span,
    threshold_decided,
    video_grid,
)
from sglang_evs.pruning.holds import held_rows, hold, release_consumed
from sglang_evs.pruning.settings import server_pruning
from sglang_evs.served import VideoFamily

# Tests only: every rank but rank 0 of a batch group inverts the keep-masks it computed, before the ranks
# agree on rank 0's; the trace then shows that the agreement, not equal inputs, decided what was kept.
PERTURB_MASKS_ENV = "SGLANG_EVS_TEST_PERTURB_MASKS"


def encoder_patch_budget(device: torch.device) -> int:
    """Most patches per vision-tower call when videos are batched across requests (0: no limit).

    SGLang's CPU vision attention (sdpa) builds a dense [patches, patches] mask for a call, so
    memory and time grow with the square of the batch: measured on CPU, 16 videos of 1600 patches
    in one call took 22 GB, and groups of 8192 patches cost 3.5x the TTFT of one video per call.
    So on CPU a call holds about one video; where attention is varlen (CUDA) the batch is
    unbounded. SGLANG_EVS_ENCODER_PATCH_BUDGET overrides.
    """
    configured = os.environ.get("SGLANG_EVS_ENCODER_PATCH_BUDGET")
    if configured is not None:
        return int(configured)
    return 2048 if device.type == "cpu" else 0


class PrunedVideos:
    MASKS_KEPT = 4096  # keep-masks by item hash (video, method and rate): small bool tensors

    def __init__(
        self, config, family: VideoFamily, embed_tokens: torch.nn.Embedding, encode: Callable[[list], torch.Tensor]
    ) -> None:
        """`encode(items)`: the model's upstream video getter, [sum of items' merged tokens, width]."""
        server_pruning(config)  # an invalid setting fails at startup, naming it
        self.pad_token_id = family.pad_token_id(config)
        self.spatial_merge_size = config.vision_config.spatial_merge_size
        self.embed_tokens = embed_tokens
        self.encode = encode
        self.masks: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.encoded_now: list[tuple] = []  # (item, rows) the running forward encoded, held after it (`holds`)
        self.rank_group = sglang.same_batch_group()  # None at one rank

    def decide_threshold(self, item) -> torch.Tensor:
        """Admission of a video waiting for its threshold (`fields.THRESHOLD`): its keep-mask ([T*h*w] bool,
        on the CPU; rank 0's at every rank), by `methods.threshold_limited_mask` on the tower's rows, whose
        kept rows are held for the video's forwards (`holds.hold`)."""
        setting = item.model_specific_data[THRESHOLD]
        if item.hash is None:  # pixels handed over as a device handle: keyed here, as SGLang keys it later (keys.py)
            item.set_pad_value()
        rows = self._timed_encode([on_device(with_stream_context(item), self.embed_tokens.weight.device)])
        limits = (setting["threshold"], setting["token_budget"], setting["min_tokens_per_group"])
        by_threshold = continued_threshold_mask if continues_stream(item) else threshold_limited_mask
        mask = by_threshold(rows, video_grid(item), self.spatial_merge_size, *limits)
        (mask,) = self._agreed([item], [mask], at_admission=True)
        own = self._own_rows(item, rows)
        hold(item, own[mask.to(own.device)])
        return mask.cpu()

    def features(self, items: list) -> list[torch.Tensor]:
        """The model's video getter: one [tokens, width] tensor per item, each encoded once per request (`holds`)."""
        encoded_now = {item.hash: rows for item, rows in self.encoded_now}  # another request's call, this forward
        rows = {id(item): held_rows(item) if item.hash not in encoded_now else encoded_now[item.hash] for item in items}
        misses = [item for item in items if rows[id(item)] is None]
        if misses:
            rows.update(zip(map(id, misses), self._encoded(misses), strict=True))
            self.encoded_now += [(item, rows[id(item)]) for item in misses]
        return [rows[id(item)] for item in items]

    def release_consumed(self, layout: BatchLayout) -> None:
        """After a forward's features were fetched: its requests' held videos whose last chunk it was let go, and
        what it encoded held for the requests that read it later (`holds.release_consumed`)."""
        encoded, self.encoded_now = self.encoded_now, []
        release_consumed(layout.requests, encoded)

    def _encoded(self, items: list) -> list[torch.Tensor]:
        """Each item's rows, from the tower (a decided threshold video's kept rows, a pruned video's region)."""
        decided = {id(item) for item in items if threshold_decided(item)}
        rest = [item for item in items if id(item) not in decided]
        by_item = dict(zip(map(id, rest), self._features(rest) if rest else [], strict=True))
        return [self._decided(item) if id(item) in decided else by_item[id(item)] for item in items]

    def _decided(self, item) -> torch.Tensor:
        """A decided threshold video's kept rows, encoded again (those from its admission were not held)."""
        rows = self._own_rows(item, self._timed_encode([with_stream_context(item)]))
        return rows[item.model_specific_data[THRESHOLD][THRESHOLD_KEPT].to(rows.device)]

    def _own_rows(self, item, rows: torch.Tensor) -> torch.Tensor:
        """An item's rows without the stream group encoded before them (`with_stream_context`), if any."""
        if not continues_stream(item):
            return rows
        _, height, width = video_grid(item)
        return rows[CONTEXT_GROUPS * height * width // self.spatial_merge_size**2 :]

    def _features(self, items: list) -> list[torch.Tensor]:
        merge = self.spatial_merge_size
        if not any(is_pruned(item) for item in items):  # one tower call, as upstream's getter makes it
            # An unpruned item may still bundle several videos (Qwen2-VL family): count all its grids.
            return list(self._timed_encode(items).split([encoder_patches(item) // merge**2 for item in items]))
        encoded_items = [with_stream_context(item) for item in items]  # a continued segment: its stream group first
        patches = [encoder_patches(item) for item in encoded_items]
        encoded = torch.cat([self._timed_encode(group) for group in self._encoder_groups(encoded_items, patches)])
        start = time.perf_counter()
        rows_per_item = encoded.split([n // merge**2 for n in patches])
        pruned = [(item, rows) for item, rows in zip(items, rows_per_item, strict=True) if is_pruned(item)]
        masks = dict(zip((id(item) for item, _ in pruned), self._decided_masks(pruned), strict=True))
        filled = {
            id(item): self._fill_region(item, self._own_rows(item, rows), masks[id(item)]) for item, rows in pruned
        }
        out = [filled.get(id(item), rows) for item, rows in zip(items, rows_per_item, strict=True)]
        if trace.enabled():
            trace.record("mask_and_fill", items=[item.hash for item in items], ms=(time.perf_counter() - start) * 1e3)
        return out

    def _decided_masks(self, pruned: list[tuple]) -> list[torch.Tensor]:
        """Each pruned (item, rows)'s keep-mask: the one its video was first pruned by, or decided now (and agreed
        across ranks, then remembered). Every rank remembers the same masks, as it runs the same batches."""
        new, seen = [], set()
        for item, rows in pruned:  # in the batch's order (the trace's keep-masks follow it), each key once
            if item.hash not in self.masks and item.hash not in seen:
                seen.add(item.hash)
                new.append((item, rows))
        decided = self._agreed([item for item, _ in new], [self._compute_keep_mask(item, rows) for item, rows in new])
        for (item, _), mask in zip(new, decided, strict=True):
            remember(self.masks, item.hash, mask, self.MASKS_KEPT)
        return [self.masks[item.hash] for item, _ in pruned]

    def _agreed(self, items: list, masks: list[torch.Tensor], **traced) -> list[torch.Tensor]:
        return agreed_and_traced(items, masks, self.rank_group, "keep_mask", **traced)

    def _compute_keep_mask(self, item, rows: torch.Tensor) -> torch.Tensor:
        """The item's method at its rate, under the budget and floor it carries (`methods.limited_mask`: exactly
        the count its region was laid out with)."""
        data = item.model_specific_data
        method, grid, merge = METHODS[data[METHOD]], video_grid(item), self.spatial_merge_size
        if continues_stream(item):  # `rows`: the stream group before the segment, then the segment's
            return continued_mask(rows, grid, merge, data[RATE], *pruned_limits(item))
        return limited_mask(method, rows, grid, merge, data[RATE], *pruned_limits(item))

    def _timed_encode(self, items: list) -> torch.Tensor:
        if not trace.enabled():
            return self.encode(items)
        device = self.embed_tokens.weight.device
        trace.settle(device)  # on a GPU the tower's kernels, not their launch, are timed
        start = time.perf_counter()
        encoded = self.encode(items)
        trace.settle(device)
        patches = sum(encoder_patches(item) for item in items)
        trace.record("video_encoded", items=[item.hash for item in items], patches=patches,
                     ms=(time.perf_counter() - start) * 1e3)  # fmt: skip
        return encoded

    def write_positions(self, layout: BatchLayout, positions: torch.Tensor) -> None:
        """Positions [3, num_tokens] of this forward: the pruned videos' rows rewritten in place.

        Region positions = the unpruned region's positions with the pruned pads' rows deleted. The
        request's own positions (`mrope_positions` [3, prompt], laid out before the keep-mask was
        known) become exact too, so a forward SGLang builds from them later sees the same: the
        speculative draft's extend over this prompt.
        """
        token_base = 0
        for mm_inputs, prefix, extend in layout.requests:
            for item in mm_inputs.mm_items if mm_inputs is not None else ():
                if not (item.is_video() and is_pruned(item)):
                    continue
                start, end = region_span(item)
                lo, hi = max(start, prefix), min(end, prefix + extend)
                if lo >= hi:
                    continue
                region_ids = item.model_specific_data[REGION_IDS]
                keep = region_keep(region_ids, self.pad_token_id, self.keep_mask(item))
                region = item.model_specific_data[REGION_POSITIONS][:, keep]
                own = mm_inputs.mrope_positions
                own[:, start:end] = region.to(own.device, own.dtype)
                exact = region[:, lo - start : hi - start]
                window = slice(token_base + lo - prefix, token_base + hi - prefix)
                positions[:, window] = exact.to(positions.device, positions.dtype)
                if trace.enabled():
                    trace.record("evs_positions", item=item.hash, chunk=[prefix, prefix + extend], region=[lo, hi])
            token_base += extend

    def keep_mask(self, item) -> torch.Tensor:
        """The item's keep-mask; if it was forgotten (embedding-cache hit long after encoding),
        the video goes through the vision tower again."""
        mask = self.masks.get(item.hash)
        if mask is None:
            self._features([item])
            mask = self.masks[item.hash]
        return mask

    def _encoder_groups(self, items: list, patches: list[int]) -> list[list]:
        """Consecutive items, each group within the patch budget (a larger video goes alone)."""
        budget = encoder_patch_budget(self.embed_tokens.weight.device)
        groups, total = [[]], 0
        for item, n in zip(items, patches, strict=True):
            if groups[-1] and budget and total + n > budget:
                groups, total = [*groups, []], 0
            groups[-1].append(item)
            total += n
        return groups

    def _fill_region(self, item, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        region_ids = item.model_specific_data[REGION_IDS].to(rows.device)
        ids = region_ids[region_keep(region_ids, self.pad_token_id, mask)]
        is_pad = ids == self.pad_token_id
        region = rows.new_zeros(ids.numel(), rows.shape[1])
        region[is_pad] = rows[mask.to(rows.device)]
        text = self.embed_tokens(ids[~is_pad])
        region[~is_pad, : text.shape[1]] = text.to(region.dtype)
        return region


def with_stream_context(item):
    """The item as the tower is to encode it: a segment that continues a stream (`fields.STREAM_CONTEXT`) with the
    stream's group before it first, its grid one temporal group longer (a copy: the item keeps its own); any other
    item as it is."""
    if not continues_stream(item):
        return item
    context = item.model_specific_data[STREAM_CONTEXT]["patches"]
    moved = copy.copy(item)
    moved.model_specific_data = {
        **item.model_specific_data,
        "video_grid_thw": torch.tensor([with_context(video_grid(item))], dtype=item.video_grid_thw.dtype),
    }
    moved.feature = torch.cat([context.to(item.feature.device, item.feature.dtype), item.feature])
    return moved


def on_device(item, device: torch.device):
    """The item with its pixels on `device` for the tower (a copy: the item keeps its own)."""
    feature = item.feature
    if not isinstance(feature, torch.Tensor) or feature.device == device:
        return item
    moved = copy.copy(item)
    moved.feature = feature.to(device)
    return moved


def remember(masks: OrderedDict, key: int, mask: torch.Tensor, bound: int) -> None:
    """A decided keep-mask kept by its key (on the host), the least recently decided forgotten past `bound`."""
    masks[key] = mask.cpu()
    masks.move_to_end(key)
    while len(masks) > bound:
        masks.popitem(last=False)


def agreed_and_traced(items: list, masks: list[torch.Tensor], group, event: str, **traced) -> list[torch.Tensor]:
    """Rank 0's keep-masks of `items` at every rank of the batch group (`agreed_masks`), each traced as `event` with
    whether this rank's own differed. Tests only (`PERTURB_MASKS_ENV`): every rank but rank 0 inverts its own
    first."""
    if os.environ.get(PERTURB_MASKS_ENV) and group is not None and group.rank_in_group:
        masks = [~mask for mask in masks]
    agreed = agreed_masks(masks, group)
    if trace.enabled():
        for item, own, mask in zip(items, masks, agreed, strict=True):
            trace.record(event, item=item.hash, kept=mask.nonzero().flatten().tolist(),
                         own_differed=not torch.equal(own, mask), **traced)  # fmt: skip
    return agreed


def agreed_masks(masks: list[torch.Tensor], group) -> list[torch.Tensor]:
    """The keep-masks (bool [rows_i] each) of rank 0 of `group`, on every rank: one broadcast of
    their concatenation (uint8; gloo has no bool). `group`: None (one rank) or an object with
    `broadcast(tensor, src=0)` that overwrites the tensor in place with rank 0's. Every rank of the
    group must call it with masks of the same lengths (they run the same batch)."""
    if group is None or not masks:
        return masks
    flat = torch.cat([mask.to(torch.uint8).flatten() for mask in masks])
    device = getattr(group, "device", flat.device)
    shared = group.broadcast(flat.to(device), src=0).to(flat.device)
    return [part.bool() for part in shared.split([mask.numel() for mask in masks])]
