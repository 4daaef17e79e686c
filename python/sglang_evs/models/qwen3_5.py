"""Qwen3.5 and Qwen3.5-MoE adapters (Qwen3.6 checkpoints use the same architecture names).

Upstream subclasses Qwen3-VL: the same vision tower, processor and M-RoPE layout, with a
hybrid language model (Gated DeltaNet and full-attention layers) that takes deepstack as the
last argument of its forward. Released Qwen3.5 towers have no deepstack levels, so the
fixed buffer holds none (width 0) although upstream still advertises `use_deepstack`.
Everything else is `models/adapter.py`.
"""

from sglang_evs import sglang_compat as sglang
from sglang_evs.models.adapter import AdaptedModel
from sglang_evs.models.graph_inputs import ReadsGraphInputs


class Qwen3_5LLMModel(ReadsGraphInputs, sglang.UpstreamQwen3_5LLMModel):
    pass


class Qwen3_5MoeLLMModel(ReadsGraphInputs, sglang.UpstreamQwen3_5MoeLLMModel):
    pass


class Qwen3_5ForConditionalGeneration(AdaptedModel, sglang.UpstreamQwen3_5):
    language_model_cls = Qwen3_5LLMModel


class Qwen3_5MoeForConditionalGeneration(AdaptedModel, sglang.UpstreamQwen3_5Moe):
    language_model_cls = Qwen3_5MoeLLMModel


EntryClass = [Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration]
