"""What every model adapter does, as one mixin (`AdaptedModel`) placed before the upstream class.

An adapter (`qwen3_vl.py`, `qwen2_vl.py`, `qwen3_5.py`, `glm4v.py`) subclasses an
upstream SGLang model with this mixin first and declares only what differs between families:
its language model class (upstream's plus `ReadsGraphInputs`). Its videos' family is its record's
(`served.SERVED`, under the architecture it serves: its class's name).
The deepstack levels are the vision tower's (`num_deepstack_embeddings`, 0 where upstream has none).
The rest is here:
  - `attach`: the language model's fixed-address `GraphInputs`, the model's `PrunedVideos` and `PrunedImages`;
  - `post_process`: the routine's hook (multimodal/contract.py), every forward: `fill_graph_inputs`;
  - `forward`: upstream's forward, through the generic embedding routine: `forward_through_routine`.
"""

import logging
import time
from dataclasses import replace

import torch

from sglang_evs import sglang_compat as sglang
from sglang_evs import trace
from sglang_evs.models.graph_inputs import (
    CARRIED_FIELD,
    CarriedInputs,
    GraphInputs,
    prefill_token_bound,
    reads_graph_inputs,
    receive_stage_positions,
    refuse_deepstack_beyond_first_stage,
)
from sglang_evs.multimodal.contract import BatchLayout, FetchedEmbedding
from sglang_evs.multimodal.embed_routine import general_mm_embed_routine
from sglang_evs.pruning.images import PrunedImages
from sglang_evs.pruning.refusals import refuse_encoder_default
from sglang_evs.pruning.settings import server_pruning
from sglang_evs.pruning.videos import PrunedVideos
from sglang_evs.served import SERVED, VideoFamily

logger = logging.getLogger(__name__)


class AdaptedModel:
    """Mixin for an upstream SGLang VLM: the generic routine, `post_process`, and the pruning of its
    videos. List it before the upstream class."""

    implements_post_process_contract = True
    language_model_cls: type  # upstream's language model class with `ReadsGraphInputs` first
    served_as: str | None = None  # the architecture whose record (`served.SERVED`) it serves; None: its class's name

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix)
        if getattr(config, "encoder_only", False):  # an `--encoder-only` server: a vision tower, no language model
            refuse_encoder_default(server_pruning(config))
            self.pruned_videos = None  # it prunes what requests ask (pruning/disaggregated.py), in the encoder
            self.pruned_images = None
            return
        attach(self, config, self.language_model_cls, getattr(self, "num_deepstack_embeddings", 0),
               super().get_video_feature, super().get_image_feature)  # fmt: skip

    @property
    def video_family(self) -> VideoFamily:
        """Its videos' processor and layout, from its record."""
        return SERVED[self.served_as or type(self).__name__].family

    def get_video_feature(self, items):
        if self.pruned_videos is None:
            return super().get_video_feature(items)
        return self.pruned_videos.features(items)

    def get_image_feature(self, items):
        if self.pruned_images is None:
            return super().get_image_feature(items)
        return self.pruned_images.features(items)

    def post_process(self, fetched: list[FetchedEmbedding], layout: BatchLayout) -> list[FetchedEmbedding]:
        return fill_graph_inputs(self, fetched, layout)

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, get_embedding=False,
                pp_proxy_tensors=None):  # fmt: skip
        # `input_embeds` is accepted and unused, as upstream Qwen2-VL's: the routine computes them.
        if getattr(self, "language_model_only", False):
            return super().forward(input_ids, positions, forward_batch, get_embedding, pp_proxy_tensors)
        return forward_through_routine(self, input_ids, positions, forward_batch, get_embedding, pp_proxy_tensors)


def attach(model, config, language_model_cls: type, deepstack_levels: int, encode_videos, encode_images=None) -> None:
    """Re-class upstream's language model as ours and give it its buffers; give the model its
    `PrunedVideos` and `PrunedImages` (`config`: the checkpoint's whole config, as the model was given it;
    `encode_videos`, `encode_images`: the upstream getters, bound to the model; None: not pruned)."""
    if type(model.model) in language_model_cls.__bases__:
        model.model.__class__ = language_model_cls  # upstream built it; ours adds only a forward override
    elif not isinstance(model.model, language_model_cls):
        # its forward would not read the buffers: deepstack and pruned positions would be lost
        raise TypeError(
            f"sglang-evs: {type(model).__name__} built a {type(model.model).__qualname__} language model; "
            f"the adapter re-classes only upstream's {language_model_cls.__bases__[-1].__qualname__}"
        )
    refuse_deepstack_beyond_first_stage(model.model, deepstack_levels)
    model.model.graph_inputs = GraphInputs(
        capacity=prefill_token_bound(sglang.prefill_limits()),
        deepstack_width=deepstack_levels * model.config.hidden_size,
        mrope=bool(model.is_mrope_enabled),
    )
    model.pruned_videos = (
        None
        if encode_videos is None
        else PrunedVideos(config, model.video_family, model.model.embed_tokens, encode_videos)
    )
    model.pruned_images = None if encode_images is None else PrunedImages(config, encode_images)
    buffers = model.model.graph_inputs
    logger.info(
        "sglang-evs %s: %d deepstack levels and M-RoPE positions in fixed buffers of %d rows",
        type(model).__name__, deepstack_levels, buffers.capacity,
    )  # fmt: skip
    if trace.enabled():
        trace.record(
            "graph_inputs_allocated",
            model=type(model).__name__,
            capacity=buffers.capacity,
            deepstack_ptr=None if buffers.deepstack is None else buffers.deepstack.data_ptr(),
            positions_ptr=None if buffers.positions is None else buffers.positions.data_ptr(),
        )


def fill_graph_inputs(model, fetched: list[FetchedEmbedding], layout: BatchLayout) -> list[FetchedEmbedding]:
    """Extend forwards: positions (pruned ones exact) and deepstack rows into the fixed buffers,
    carried on the batch; the main channels are returned for scattering."""
    forward_batch = layout.forward_batch
    if model.pruned_videos is not None:
        model.pruned_videos.release_consumed(layout)
    if not reads_graph_inputs(forward_batch.forward_mode):
        return fetched
    carried = model.model.graph_inputs.write(layout.num_tokens, forward_batch.mrope_positions)
    if carried.positions is not None and model.pruned_videos is not None:
        model.pruned_videos.write_positions(layout, carried.positions)
    if carried.positions is not None and model.pruned_images is not None:
        model.pruned_images.write_positions(layout, carried.positions)
    setattr(forward_batch, CARRIED_FIELD, carried)
    if carried.deepstack is None:
        return fetched
    return _split_deepstack(fetched, carried, model.config.hidden_size)


def _split_deepstack(fetched: list[FetchedEmbedding], carried: CarriedInputs, hidden: int) -> list[FetchedEmbedding]:
    main = []
    for item in fetched:
        if item.embedding.shape[1] == hidden:  # a medium without deepstack levels (Qwen3-Omni's audio)
            main.append(item)
            continue
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
def forward_through_routine(model, input_ids, positions, forward_batch, get_embedding=False, pp_proxy_tensors=None):
    """Upstream's forward with the generic routine (and no deepstack argument)."""
    if model.is_mrope_enabled:
        positions = forward_batch.mrope_positions
    if pp_proxy_tensors is not None and reads_graph_inputs(forward_batch.forward_mode):  # a later pipeline stage
        receive_stage_positions(model.model.graph_inputs, forward_batch, int(input_ids.shape[0]), pp_proxy_tensors)
    start = time.perf_counter() if trace.enabled() else None
    hidden_states = general_mm_embed_routine(
        input_ids=input_ids,
        forward_batch=forward_batch,
        language_model=model.model,
        multimodal_model=model,
        positions=positions,
        pp_proxy_tensors=pp_proxy_tensors,
    )
    if start is not None:
        _trace_forward(forward_batch, input_ids, start)
    aux_hidden_states = None
    if getattr(model, "capture_aux_hidden_states", False):
        hidden_states, aux_hidden_states = hidden_states
    pp_group = getattr(model, "pp_group", None)
    if pp_group is not None and not pp_group.is_last_rank:
        return hidden_states
    if get_embedding:
        return model.pooler(hidden_states, forward_batch)
    return model.logits_processor(input_ids, hidden_states, model.lm_head, forward_batch, aux_hidden_states)


def _trace_forward(forward_batch, input_ids, start: float) -> None:
    """Per-stage timing (trace only): the whole extend forward, encoders included (see
    `pruning/videos.py` for the encoder's and the mask's share). A graph capture (a target-verify or
    draft-extend graph captures the whole forward) is not timed (`trace.settle`)."""
    if not forward_batch.forward_mode.is_extend() or not trace.settle(input_ids.device):
        return
    trace.record("extend_forward", tokens=int(input_ids.shape[0]), ms=(time.perf_counter() - start) * 1e3)
