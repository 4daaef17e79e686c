"""Model side of image pruning: encode, keep-mask, kept rows, exact positions per forward.

A model adapter owns one `PrunedImages` and routes two things through it:
  - `get_image_feature(items)` -> `PrunedImages.features(items)`: the batch's images go through the model's own
    tower in one call, as upstream's getter sends them; a pruned item (`fields.is_pruned`: one image, or several where
    an item still bundles them) comes back as the rows each image's method keeps (`methods.images`: every
    column scored, so Qwen3-VL's deepstack levels are pruned by the same mask), image after image in raster order,
    for the pads the tokenizer side left (`regions.prune_image_regions`);
  - its `post_process` calls `write_positions(layout, positions)`: each kept pad at the M-RoPE position its row has
    in the unpruned prompt: the item's unpruned pad positions with the pruned ones deleted (the rule videos follow).
With no pruned image in a call, the getter is upstream's, bit for bit.

An item's keep-mask (its images' masks one after the other) is decided once, by its first encode, and remembered by
its key (the content hash folded with the method and rate): a later encode of the same item (the next prefill chunk,
an embedding-cache miss, a radix repeat) keeps the same rows. Under tensor parallelism rank 0's masks are every
rank's (`videos.agreed_and_traced`).
"""

import math
from collections import OrderedDict
from collections.abc import Callable

import torch

from sglang_evs import sglang_compat as sglang
from sglang_evs import trace
from sglang_evs.methods import grid_tokens
from sglang_evs.methods.images import IMAGE_METHODS, image_kept_count
from sglang_evs.multimodal.contract import BatchLayout
from sglang_evs.pruning.fields import METHOD, RATE, REGION_POSITIONS, image_grids, is_pruned
from sglang_evs.pruning.settings import server_image_pruning
from sglang_evs.pruning.videos import agreed_and_traced, remember


class PrunedImages:
    MASKS_KEPT = 4096  # keep-masks by item key (image, method and rate): small bool tensors

    def __init__(self, config, encode: Callable[[list], torch.Tensor]) -> None:
        """`encode(items)`: the model's upstream image getter, [sum of items' merged tokens, width]."""
        server_image_pruning(config)  # an invalid setting fails at startup, naming it
        self.spatial_merge_size = config.vision_config.spatial_merge_size
        self.encode = encode
        self.masks: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.rank_group = sglang.same_batch_group()  # None at one rank

    def features(self, items: list):
        """The model's image getter: upstream's tensor where no item is pruned; else one [rows, width] tensor per
        item, a pruned item's kept rows."""
        if not any(is_pruned(item) for item in items):
            return self.encode(items)
        rows = self.encode(items).split([sum(self._tokens(item)) for item in items])
        pruned = [(item, own) for item, own in zip(items, rows, strict=True) if is_pruned(item)]
        masks = self._decided_masks(pruned)
        kept = {id(item): own[mask.to(own.device)] for (item, own), mask in zip(pruned, masks, strict=True)}
        return [kept.get(id(item), own) for item, own in zip(items, rows, strict=True)]

    def write_positions(self, layout: BatchLayout, positions: torch.Tensor) -> None:
        """Positions [3, num_tokens] of this forward: every pad of a pruned image item that the forward covers at the
        unpruned position of the row it holds, in place; and the request's own positions (`mrope_positions`, laid
        out before the mask was known) made exact too, for a forward SGLang builds from them later (a speculative
        draft's extend)."""
        token_base = 0
        for mm_inputs, prefix, extend in layout.requests:
            for item in mm_inputs.mm_items if mm_inputs is not None else ():
                covered = item.offsets[0][0] < prefix + extend and item.offsets[-1][1] >= prefix
                if not (covered and item.is_image() and is_pruned(item)):
                    continue
                kept = item.model_specific_data[REGION_POSITIONS][:, self.keep_mask(item)]
                done = 0
                for start, end in item.offsets:  # each image's kept pads, in order
                    span = kept[:, done : done + end + 1 - start]
                    done += end + 1 - start
                    own = mm_inputs.mrope_positions
                    own[:, start : end + 1] = span.to(own.device, own.dtype)
                    lo, hi = max(start, prefix), min(end + 1, prefix + extend)
                    if lo < hi:
                        window = slice(token_base + lo - prefix, token_base + hi - prefix)
                        positions[:, window] = span[:, lo - start : hi - start].to(positions.device, positions.dtype)
                        if trace.enabled():
                            trace.record("image_positions", item=item.hash, chunk=[prefix, prefix + extend],
                                         span=[lo, hi])  # fmt: skip
            token_base += extend

    def keep_mask(self, item) -> torch.Tensor:
        """The image's keep-mask; if it was forgotten (an embedding-cache hit long after encoding), the image goes
        through the tower again."""
        if item.hash not in self.masks:
            self.features([item])
        return self.masks[item.hash]

    def _decided_masks(self, pruned: list[tuple]) -> list[torch.Tensor]:
        """Each pruned (item, rows)'s keep-mask: remembered, or decided now by its method (rank 0's at every
        rank) and remembered."""
        new = list({item.hash: (item, rows) for item, rows in pruned if item.hash not in self.masks}.values())
        own = [self._compute_keep_mask(item, rows) for item, rows in new]
        decided = agreed_and_traced([item for item, _ in new], own, self.rank_group, "image_keep_mask")
        for (item, _), mask in zip(new, decided, strict=True):
            remember(self.masks, item.hash, mask, self.MASKS_KEPT)
        return [self.masks[item.hash] for item, _ in pruned]

    def _compute_keep_mask(self, item, rows: torch.Tensor) -> torch.Tensor:
        """The item's images' masks, one after the other, each its method's choice of its own rows."""
        method, rate = IMAGE_METHODS[item.model_specific_data[METHOD]], item.model_specific_data[RATE]
        per_image = rows.split(self._tokens(item))
        return torch.cat([method.keep_mask(own, image_kept_count(own.shape[0], rate)) for own in per_image])

    def _tokens(self, item) -> list[int]:
        """Merged tokens of each image of the item."""
        return [math.prod(grid_tokens(grid, self.spatial_merge_size)) for grid in image_grids(item)]
