"""Qwen3-VL and Qwen3-VL-MoE adapters: deepstack levels in the fixed buffers, videos prunable.

The family's specifics: upstream's Qwen3 language models (which add deepstack level i after
decoder layer i), the vision tower's deepstack levels, and video rows [main | deepstack...]
that the keep-mask scores together. Everything else is `models/adapter.py`.
"""

from sglang_evs import sglang_compat as sglang
from sglang_evs.models.adapter import AdaptedModel
from sglang_evs.models.graph_inputs import ReadsGraphInputs


class Qwen3LLMModel(ReadsGraphInputs, sglang.UpstreamQwen3LLMModel):
    pass


class Qwen3MoeLLMModel(ReadsGraphInputs, sglang.UpstreamQwen3MoeLLMModel):
    pass


class Qwen3VLForConditionalGeneration(AdaptedModel, sglang.UpstreamQwen3VL):
    language_model_cls = Qwen3LLMModel


class Qwen3VLMoeForConditionalGeneration(AdaptedModel, sglang.UpstreamQwen3VLMoe):
    language_model_cls = Qwen3MoeLLMModel


EntryClass = [Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration]
