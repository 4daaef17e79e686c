"""Qwen3-VL whose deepstack features travel on the ForwardBatch, not as a language-model argument.

Upstream passes deepstack as `input_deepstack_embeds` to the language model, which
SGLang's prefill CUDA graph replay ignores. Here the model's `post_process` hook
(see `sglang_evs.multimodal.contract`) splits the deepstack channels off the
fetched features and writes them into a model-owned buffer with a fixed address,
exposed as `forward_batch.deepstack_embeds`; the language model reads them from
there, so `input_embeds` is the only tensor input it needs.
"""

import logging
import os
from collections import OrderedDict
from dataclasses import replace

import torch

from sglang_evs import sglang_compat as sglang
from sglang_evs import trace
from sglang_evs.evs import PRUNING_RATE_SETTING, retention_mask, validate_pruning_rate
from sglang_evs.multimodal.contract import BatchLayout, FetchedEmbedding
from sglang_evs.multimodal.embed_routine import general_mm_embed_routine
from sglang_evs.processors.pruned_layout import RATE, REGION_IDS, REGION_POSITIONS, is_pruned, region_keep

logger = logging.getLogger(__name__)

DEEPSTACK_FIELD = "deepstack_embeds"


class DeepstackBuffer:
    """Fixed-address rows for the deepstack features of one forward: [capacity, levels * hidden].

    `rows(n)` zero-fills and returns the first n rows, so tokens without media
    (text, decode) carry zeros and nothing of an earlier forward survives. A
    forward larger than the capacity (never one a CUDA graph was captured for)
    gets a temporary tensor and leaves the fixed buffer where it is.
    """

    def __init__(self, width: int) -> None:
        self.width = width
        self.storage: torch.Tensor | None = None

    def rows(self, n: int, like: torch.Tensor) -> torch.Tensor:
        if self.storage is None:
            self.storage = torch.zeros(max(n, _planned_capacity()), self.width, dtype=like.dtype, device=like.device)
        if n > self.storage.shape[0]:
            logger.warning("deepstack rows %d exceed the fixed buffer (%d): temporary tensor", n, len(self.storage))
            return torch.zeros(n, self.width, dtype=like.dtype, device=like.device)
        view = self.storage[:n]
        view.zero_()
        return view


def _planned_capacity() -> int:
    """The most tokens one forward carries under the server's settings."""
    args = sglang.get_server_args()
    if args is None:
        return 0
    return max(int(args.max_prefill_tokens or 0), int(args.chunked_prefill_size or 0), 1)


class _ReadsDeepstackFromBatch:
    """Language-model mixin: deepstack comes from `forward_batch.deepstack_embeds`."""

    def forward(
        self,
        input_ids,
        positions,
        forward_batch,
        input_embeds=None,
        pp_proxy_tensors=None,
        input_deepstack_embeds=None,
    ):
        handed_deepstack = input_deepstack_embeds is not None
        if input_deepstack_embeds is None:
            input_deepstack_embeds = getattr(forward_batch, DEEPSTACK_FIELD, None)
        if trace.enabled():
            trace.record(
                "language_model_inputs",
                handed_deepstack=handed_deepstack,
                tensor_kwargs=sorted(
                    k for k, v in {"input_ids": input_ids, "input_embeds": input_embeds}.items() if v is not None
                ),
                deepstack_ptr=None if input_deepstack_embeds is None else input_deepstack_embeds.data_ptr(),
                rows=None if input_embeds is None else int(input_embeds.shape[0]),
            )
        return super().forward(
            input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors, input_deepstack_embeds
        )


class Qwen3LLMModel(_ReadsDeepstackFromBatch, sglang.UpstreamQwen3LLMModel):
    pass


class Qwen3MoeLLMModel(_ReadsDeepstackFromBatch, sglang.UpstreamQwen3MoeLLMModel):
    pass


def encoder_patch_budget(device: torch.device) -> int:
    """Most patches per vision-tower call when EVS batches videos across requests (0: no limit).

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


class _EVSVideo:
    """Model mixin: EVS right after the vision tower, exact positions for whatever a chunk covers."""

    _MASKS_KEPT = 4096  # keep-masks by item hash (video and rate): small bool tensors

    def _init_evs(self, config) -> None:
        validate_pruning_rate(getattr(config, PRUNING_RATE_SETTING, 0.0))  # fail at startup, naming it
        self.evs_masks: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.video_token_id = config.video_token_id
        self.spatial_merge_size = config.vision_config.spatial_merge_size

    def get_video_feature(self, items):
        """Videos of the batch go through the vision tower together (in groups of at most
        `encoder_patch_budget` patches); pruned ones come back as their filled region:
        [len(region), width] (framing slots: text embedding, zero deepstack)."""
        if not any(is_pruned(item) for item in items):
            return super().get_video_feature(items)
        merge = self.spatial_merge_size
        patches = [int(item.video_grid_thw.reshape(-1, 3)[0].prod()) for item in items]
        features = torch.cat(
            [super(_EVSVideo, self).get_video_feature(group) for group in self._encoder_groups(items, patches)]
        )
        out = []
        for item, rows in zip(items, features.split([n // merge**2 for n in patches]), strict=True):
            if not is_pruned(item):
                out.append(rows)
                continue
            grid = item.video_grid_thw.reshape(-1, 3)[0].tolist()
            mask = retention_mask(rows, grid, merge, item.model_specific_data[RATE])
            self._remember_mask(item.hash, mask)
            out.append(self._fill_region(item, rows, mask))
        return out

    def _encoder_groups(self, items: list, patches: list[int]) -> list[list]:
        """Consecutive items, each group within the patch budget (a larger video goes alone)."""
        budget = encoder_patch_budget(self.model.embed_tokens.weight.device)
        groups, total = [[]], 0
        for item, n in zip(items, patches, strict=True):
            if groups[-1] and budget and total + n > budget:
                groups, total = [*groups, []], 0
            groups[-1].append(item)
            total += n
        return groups

    def _fill_region(self, item, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        region_ids = item.model_specific_data[REGION_IDS].to(rows.device)
        ids = region_ids[region_keep(region_ids, self.video_token_id, mask)]
        is_pad = ids == self.video_token_id
        region = rows.new_zeros(ids.numel(), rows.shape[1])
        region[is_pad] = rows[mask.to(rows.device)]
        text = self.model.embed_tokens(ids[~is_pad])
        region[~is_pad, : text.shape[1]] = text.to(region.dtype)
        return region

    def _remember_mask(self, key: int, mask: torch.Tensor) -> None:
        self.evs_masks[key] = mask.cpu()
        self.evs_masks.move_to_end(key)
        while len(self.evs_masks) > self._MASKS_KEPT:
            self.evs_masks.popitem(last=False)

    def _mask_of(self, item) -> torch.Tensor:
        mask = self.evs_masks.get(item.hash)
        if mask is None:  # embedding-cache hit after the mask was forgotten: encode again
            self.get_video_feature([item])
            mask = self.evs_masks[item.hash]
        return mask

    def write_pruned_positions(self, layout: BatchLayout) -> None:
        """Positions of the pruned videos' tokens in this forward, written in place.

        Region positions = the unpruned region's positions with the pruned pads' rows deleted.
        """
        positions = layout.forward_batch.mrope_positions
        token_base = 0
        for mm_inputs, prefix, extend in layout.requests:
            for item in mm_inputs.mm_items if mm_inputs is not None else ():
                if not (item.is_video() and is_pruned(item)):
                    continue
                start, end = item.offsets[0][0], item.offsets[0][1] + 1
                lo, hi = max(start, prefix), min(end, prefix + extend)
                if lo >= hi:
                    continue
                region_ids = item.model_specific_data[REGION_IDS]
                keep = region_keep(region_ids, self.video_token_id, self._mask_of(item))
                exact = item.model_specific_data[REGION_POSITIONS][:, keep][:, lo - start : hi - start]
                window = slice(token_base + lo - prefix, token_base + hi - prefix)
                positions[:, window] = exact.to(positions.device, positions.dtype)
                if trace.enabled():
                    trace.record("evs_positions", item=item.hash, chunk=[prefix, prefix + extend], region=[lo, hi])
            token_base += extend


class _DeepstackOnBatch:
    """Model mixin: `post_process` puts deepstack on the batch; `forward` uses the generic routine."""

    def _init_deepstack(self, language_model_cls: type) -> None:
        # Upstream builds its own language model class (it picks the config by
        # class identity); ours adds only a forward override, so re-class it.
        if type(getattr(self, "model", None)) in language_model_cls.__bases__:
            self.model.__class__ = language_model_cls
        levels = self.num_deepstack_embeddings
        self.deepstack = DeepstackBuffer(levels * self.config.hidden_size) if levels else None
        logger.info("sglang-evs %s: %d deepstack levels travel on the ForwardBatch", type(self).__name__, levels)

    def post_process(self, fetched: list[FetchedEmbedding], layout: BatchLayout) -> list[FetchedEmbedding]:
        if layout.forward_batch.mrope_positions is not None and not layout.forward_batch.forward_mode.is_decode():
            self.write_pruned_positions(layout)
        if self.deepstack is None:
            return fetched
        hidden = self.config.hidden_size
        deepstack = self.deepstack.rows(layout.num_tokens, like=self.model.embed_tokens.weight)
        main = []
        for item in fetched:
            sglang.scatter_mm_embedding(dest=deepstack, mask=item.mask, src=item.embedding[:, hidden:])
            main.append(replace(item, embedding=item.embedding[:, :hidden]))
        setattr(layout.forward_batch, DEEPSTACK_FIELD, deepstack)
        if trace.enabled():
            trace.record(
                "deepstack",
                data_ptr=deepstack.data_ptr(),
                rows=layout.num_tokens,
                media_rows=sum(int(item.mask.sum()) for item in fetched),
                nonzero_rows=int(deepstack.abs().sum(dim=1).gt(0).sum()),
            )
        return main

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch, get_embedding=False, pp_proxy_tensors=None):
        if self.language_model_only:
            return super().forward(input_ids, positions, forward_batch, get_embedding, pp_proxy_tensors)
        if self.is_mrope_enabled:
            positions = forward_batch.mrope_positions
        hidden_states = general_mm_embed_routine(
            input_ids=input_ids,
            forward_batch=forward_batch,
            language_model=self.model,
            multimodal_model=self,
            positions=positions,
            pp_proxy_tensors=pp_proxy_tensors,
        )
        aux_hidden_states = None
        if self.capture_aux_hidden_states:
            hidden_states, aux_hidden_states = hidden_states
        if not self.pp_group.is_last_rank:
            return hidden_states
        if get_embedding:
            return self.pooler(hidden_states, forward_batch)
        return self.logits_processor(input_ids, hidden_states, self.lm_head, forward_batch, aux_hidden_states)


class Qwen3VLForConditionalGeneration(_DeepstackOnBatch, _EVSVideo, sglang.UpstreamQwen3VL):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix, sglang.UpstreamQwen3LLMModel)
        self._init_deepstack(Qwen3LLMModel)
        self._init_evs(config)


class Qwen3VLMoeForConditionalGeneration(_DeepstackOnBatch, _EVSVideo, sglang.UpstreamQwen3VLMoe):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix, sglang.UpstreamQwen3MoeLLMModel)
        self._init_deepstack(Qwen3MoeLLMModel)
        self._init_evs(config)


EntryClass = [Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration]
