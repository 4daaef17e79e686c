"""Model side of image pruning: encode, keep-mask, kept rows, exact positions per forward.

A model adapter owns one `PrunedImages` and routes two things through it:
  - `get_image_feature(items)` -> `PrunedImages.features(items)`: the batch's images go through the model's own
    tower in one call, as upstream's getter sends them; a pruned image (`fields.is_pruned`) comes back as the rows
    its method keeps (`methods.images`: every column scored, so Qwen3-VL's deepstack levels are pruned by the same
    mask), in raster order, at the pads the tokenizer side left (`regions.prune_image_regions`);
  - its `post_process` calls `write_positions(layout, positions)`: each kept row at the M-RoPE position it has in
    the unpruned prompt (`videos.write_region_positions`, the rule videos follow).
With no pruned image in a call, the getter is upstream's, bit for bit.

Each image's keep-mask is decided once, by its first encode, and remembered by its key (the content hash folded
with the method and rate): a later encode of the same image (the next prefill chunk, an embedding-cache miss, a
radix repeat) keeps the same rows. Under tensor parallelism rank 0's masks are every rank's
(`videos.agreed_and_traced`).
"""

from collections import OrderedDict
from collections.abc import Callable

import torch

from sglang_evs import sglang_compat as sglang
from sglang_evs.methods import grid_tokens
from sglang_evs.methods.images import IMAGE_METHODS, image_kept_count
from sglang_evs.multimodal.contract import BatchLayout
from sglang_evs.pruning.fields import METHOD, RATE, image_grids, is_pruned
from sglang_evs.pruning.settings import server_image_pruning
from sglang_evs.pruning.videos import agreed_and_traced, write_region_positions
from sglang_evs.served import VideoFamily


class PrunedImages:
    MASKS_KEPT = 4096  # keep-masks by item key (image, method and rate): small bool tensors

    def __init__(self, config, family: VideoFamily, encode: Callable[[list], torch.Tensor]) -> None:
        """`encode(items)`: the model's upstream image getter, [sum of items' merged tokens, width]."""
        server_image_pruning(config)  # an invalid setting fails at startup, naming it
        self.pad_token_id = family.image_pad_token_id(config)
        self.spatial_merge_size = config.vision_config.spatial_merge_size
        self.encode = encode
        self.masks: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.rank_group = sglang.same_batch_group()  # None at one rank

    def features(self, items: list):
        """The model's image getter: upstream's tensor where no item is pruned; else one [rows, width] tensor per
        item, a pruned image's kept rows."""
        if not any(is_pruned(item) for item in items):
            return self.encode(items)
        merge = self.spatial_merge_size
        rows = self.encode(items).split([int(image_grids(item).prod(dim=-1).sum()) // merge**2 for item in items])
        pruned = [(item, own) for item, own in zip(items, rows, strict=True) if is_pruned(item)]
        masks = dict(zip((id(item) for item, _ in pruned), self._decided_masks(pruned), strict=True))
        kept = {id(item): own[masks[id(item)].to(own.device)] for item, own in pruned}
        return [kept.get(id(item), own) for item, own in zip(items, rows, strict=True)]

    def write_positions(self, layout: BatchLayout, positions: torch.Tensor) -> None:
        """Positions [3, num_tokens] of this forward: the pruned images' rows rewritten in place."""
        write_region_positions(layout, positions, lambda item: item.is_image() and is_pruned(item),
                               self.pad_token_id, self.keep_mask)  # fmt: skip

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
            self.masks[item.hash] = mask.cpu()
            while len(self.masks) > self.MASKS_KEPT:
                self.masks.popitem(last=False)
        return [self.masks[item.hash] for item, _ in pruned]

    def _compute_keep_mask(self, item, rows: torch.Tensor) -> torch.Tensor:
        data = item.model_specific_data
        t, h, w = grid_tokens(image_grids(item)[0], self.spatial_merge_size)
        return IMAGE_METHODS[data[METHOD]].keep_mask(rows, image_kept_count(t * h * w, data[RATE]))
