"""Qwen3-VL whose language model reads deepstack and positions from fixed-address buffers.

Upstream passes deepstack as `input_deepstack_embeds` to the language model, which
SGLang's prefill CUDA graphs never capture (the capture batch has no media) and never
hand over at replay. Here the model's `post_process` hook (see
`sglang_evs.multimodal.contract`) writes the deepstack rows and the M-RoPE positions
(pruned ones included) into `GraphInputs`, buffers the language model owns from
construction on, and the language model reads them there, so `input_embeds` is the only
tensor a graph replay has to be handed (`models/graph_inputs.py`).
"""

import logging
import os
from collections import OrderedDict
from dataclasses import replace

import torch

from sglang_evs import sglang_compat as sglang
from sglang_evs import trace
from sglang_evs.evs import PRUNING_RATE_SETTING, retention_mask, validate_pruning_rate
from sglang_evs.models.graph_inputs import (
    CARRIED_FIELD,
    CarriedInputs,
    GraphInputs,
    prefill_token_bound,
    reads_graph_inputs,
)
from sglang_evs.multimodal.contract import BatchLayout, FetchedEmbedding
from sglang_evs.multimodal.embed_routine import general_mm_embed_routine
from sglang_evs.processors.pruned_layout import RATE, REGION_IDS, REGION_POSITIONS, is_pruned, region_keep

logger = logging.getLogger(__name__)


class _ReadsGraphInputs:
    """Language-model mixin: in extend forwards, positions and deepstack come from what the batch
    carries, or from the model's `GraphInputs` when it carries nothing (a graph's capture batch).

    No `input_deepstack_embeds` parameter: SGLang's deepstack warm-up
    (`run_dummy_multimodal_deepstack_forward`) checks the signature and leaves this model alone.
    """

    graph_inputs: GraphInputs

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None):
        deepstack = None
        carried = None
        if reads_graph_inputs(forward_batch.forward_mode):
            carried = getattr(forward_batch, CARRIED_FIELD, None)
            if carried is None:
                carried = self.graph_inputs.view(positions.shape[-1])
            if carried.positions is not None:
                positions = carried.positions
            deepstack = carried.deepstack
        if trace.enabled():
            trace.record(
                "language_model_inputs",
                mode=forward_batch.forward_mode.name,
                carried_by_batch=getattr(forward_batch, CARRIED_FIELD, None) is not None,
                deepstack_ptr=None if deepstack is None else deepstack.data_ptr(),
                positions_ptr=positions.data_ptr(),
                rows=int(positions.shape[-1]),
            )
        return super().forward(input_ids, positions, forward_batch, input_embeds, pp_proxy_tensors, deepstack)


class Qwen3LLMModel(_ReadsGraphInputs, sglang.UpstreamQwen3LLMModel):
    pass


class Qwen3MoeLLMModel(_ReadsGraphInputs, sglang.UpstreamQwen3MoeLLMModel):
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

    def write_pruned_positions(self, layout: BatchLayout, positions: torch.Tensor) -> None:
        """Positions [3, num_tokens] of this forward: the pruned videos' rows rewritten in place.

        Region positions = the unpruned region's positions with the pruned pads' rows deleted.
        """
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


class _GraphInputsOnBatch:
    """Model mixin: `post_process` fills the language model's `GraphInputs`; `forward` uses the
    generic routine."""

    implements_post_process_contract = True

    def _init_graph_inputs(self, language_model_cls: type) -> None:
        # Upstream builds its own language model class (it picks the config by
        # class identity); ours adds only a forward override, so re-class it.
        if type(getattr(self, "model", None)) in language_model_cls.__bases__:
            self.model.__class__ = language_model_cls
        levels = self.num_deepstack_embeddings
        self.model.graph_inputs = GraphInputs(
            capacity=prefill_token_bound(sglang.prefill_limits()),
            deepstack_width=levels * self.config.hidden_size,
            mrope=bool(self.is_mrope_enabled),
        )
        buffers = self.model.graph_inputs
        logger.info(
            "sglang-evs %s: %d deepstack levels and M-RoPE positions in fixed buffers of %d rows",
            type(self).__name__, levels, buffers.capacity,
        )  # fmt: skip
        if trace.enabled():
            trace.record(
                "graph_inputs_allocated",
                capacity=buffers.capacity,
                deepstack_ptr=None if buffers.deepstack is None else buffers.deepstack.data_ptr(),
                positions_ptr=None if buffers.positions is None else buffers.positions.data_ptr(),
            )

    def post_process(self, fetched: list[FetchedEmbedding], layout: BatchLayout) -> list[FetchedEmbedding]:
        forward_batch = layout.forward_batch
        if not reads_graph_inputs(forward_batch.forward_mode):
            return fetched
        carried = self.model.graph_inputs.write(layout.num_tokens, forward_batch.mrope_positions)
        if carried.positions is not None:
            self.write_pruned_positions(layout, carried.positions)
        setattr(forward_batch, CARRIED_FIELD, carried)
        if carried.deepstack is None:
            return fetched
        return self._split_deepstack(fetched, carried)

    def _split_deepstack(self, fetched: list[FetchedEmbedding], carried: CarriedInputs) -> list[FetchedEmbedding]:
        """Deepstack channels into the carried rows; the main channels are what gets scattered."""
        hidden = self.config.hidden_size
        main = []
        for item in fetched:
            sglang.scatter_mm_embedding(dest=carried.deepstack, mask=item.mask, src=item.embedding[:, hidden:])
            main.append(replace(item, embedding=item.embedding[:, :hidden]))
        if trace.enabled():
            trace.record(
                "deepstack",
                data_ptr=carried.deepstack.data_ptr(),
                rows=int(carried.deepstack.shape[0]),
                media_rows=sum(int(item.mask.sum()) for item in fetched),
                nonzero_rows=int(carried.deepstack.abs().sum(dim=1).gt(0).sum()),
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


class Qwen3VLForConditionalGeneration(_GraphInputsOnBatch, _EVSVideo, sglang.UpstreamQwen3VL):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix, sglang.UpstreamQwen3LLMModel)
        self._init_graph_inputs(Qwen3LLMModel)
        self._init_evs(config)


class Qwen3VLMoeForConditionalGeneration(_GraphInputsOnBatch, _EVSVideo, sglang.UpstreamQwen3VLMoe):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix, sglang.UpstreamQwen3MoeLLMModel)
        self._init_graph_inputs(Qwen3MoeLLMModel)
        self._init_evs(config)


EntryClass = [Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration]
