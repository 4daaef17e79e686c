"""Qwen3.5 and Qwen3.5-MoE adapters (Qwen3.6 checkpoints use the same architecture names).

Upstream subclasses Qwen3-VL: the same vision tower, processor and M-RoPE layout, with a
hybrid language model (Gated DeltaNet and full-attention layers) that takes deepstack as the
last argument of its forward. Released Qwen3.5 towers have no deepstack levels, so the
fixed buffer holds none (width 0) although upstream still advertises `use_deepstack`.
Everything else is `models/adapter.py`.

Served with its MTP head (`--speculative-algorithm NEXTN`), the draft is `Qwen3_5MTP` below.
"""

from sglang_evs import sglang_compat as sglang
from sglang_evs import trace
from sglang_evs.models.adapter import AdaptedModel
from sglang_evs.models.graph_inputs import ReadsGraphInputs, trace_rope_positions


class Qwen3_5LLMModel(ReadsGraphInputs, sglang.UpstreamQwen3_5LLMModel):
    pass


class Qwen3_5MoeLLMModel(ReadsGraphInputs, sglang.UpstreamQwen3_5MoeLLMModel):
    pass


class Qwen3_5ForConditionalGeneration(AdaptedModel, sglang.UpstreamQwen3_5):
    language_model_cls = Qwen3_5LLMModel


class Qwen3_5MoeForConditionalGeneration(AdaptedModel, sglang.UpstreamQwen3_5Moe):
    language_model_cls = Qwen3_5MoeLLMModel


class ReadsTargetPositions:
    """Mixin for a NEXTN draft (the checkpoint's own MTP layer), placed before upstream's class: the draft
    is given the target's M-RoPE positions.

    Upstream hands the draft the 1-D positions (the token's index in the sequence) where the target
    reads M-RoPE ones: the same numbers for text, other ones for every media token and every token
    after one, and after a pruned video not even the index the token would have had. Here the draft
    reads `forward_batch.mrope_positions`, which SGLang builds for it as for the target: from the
    request's positions (made exact once the keep-mask is known, `PrunedVideos.write_positions`)
    over the prompt, and from the request's `mrope_position_delta` (which counts the pruned tokens)
    while decoding. Rows pair token t's hidden state and position with token t+1's embedding, as
    upstream's. Greedy tokens and logprobs are the target's either way; the draft's positions decide
    only how many drafts are accepted.

    `is_mrope_enabled` says so to SGLang's prefill graph runner, which captures the draft's layers
    directly and hands them `forward_batch.mrope_positions` only where the model declares it (without
    it a replayed draft prefill read the 1-D positions).
    """

    is_mrope_enabled = True  # whenever the batch has M-RoPE positions, as `forward` reads them

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, **kwargs):
        if forward_batch.mrope_positions is not None:
            positions = forward_batch.mrope_positions
        if trace.positions_enabled():
            trace_rope_positions("draft", positions, forward_batch)
        return super().forward(input_ids, positions, forward_batch, input_embeds, **kwargs)


class Qwen3_5MTP(ReadsTargetPositions, sglang.UpstreamQwen3_5MTP):
    """The NEXTN draft of Qwen3.5 / Qwen3.6 (one MTP layer, dense or MoE)."""


EntryClass = [Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration, Qwen3_5MTP]
