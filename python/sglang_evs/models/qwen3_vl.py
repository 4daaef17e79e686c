"""Qwen3-VL whose deepstack features travel on the ForwardBatch, not as a language-model argument.

Upstream passes deepstack as `input_deepstack_embeds` to the language model, which
SGLang's prefill CUDA graph replay ignores. Here the model's `post_process` hook
(see `sglang_evs.multimodal.contract`) splits the deepstack channels off the
fetched features and writes them into a model-owned buffer with a fixed address,
exposed as `forward_batch.deepstack_embeds`; the language model reads them from
there, so `input_embeds` is the only tensor input it needs.
"""

import logging
from dataclasses import replace

import torch

from sglang_evs import sglang_compat as sglang
from sglang_evs import trace
from sglang_evs.multimodal.contract import BatchLayout, FetchedEmbedding
from sglang_evs.multimodal.embed_routine import general_mm_embed_routine

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


class Qwen3VLForConditionalGeneration(_DeepstackOnBatch, sglang.UpstreamQwen3VL):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix, sglang.UpstreamQwen3LLMModel)
        self._init_deepstack(Qwen3LLMModel)


class Qwen3VLMoeForConditionalGeneration(_DeepstackOnBatch, sglang.UpstreamQwen3VLMoe):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix, sglang.UpstreamQwen3MoeLLMModel)
        self._init_deepstack(Qwen3MoeLLMModel)


EntryClass = [Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration]
