"""Qwen2.5-VL and Qwen2-VL adapters: videos prunable, positions in the fixed buffers.

The family's specifics: SGLang's Qwen2 language model, no deepstack, and a video that is one
run of pads (no framing text between groups). Its M-RoPE positions come from upstream's own
`get_rope_index` in the tokenizer process: temporal position = group time
(`second_per_grid_ts` x `tokens_per_second`) for Qwen2.5-VL, the group index for Qwen2-VL;
pruning deletes the pruned pads' rows from them. Everything else is `models/adapter.py`.
"""

from sglang_evs import sglang_compat as sglang
from sglang_evs.models.adapter import AdaptedModel
from sglang_evs.models.graph_inputs import ReadsGraphInputs


class Qwen2LLMModel(ReadsGraphInputs, sglang.UpstreamQwen2Model):
    pass


class Qwen2_5_VLForConditionalGeneration(AdaptedModel, sglang.UpstreamQwen2_5_VL):
    language_model_cls = Qwen2LLMModel


class Qwen2VLForConditionalGeneration(AdaptedModel, sglang.UpstreamQwen2VL):
    language_model_cls = Qwen2LLMModel


EntryClass = [Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration]
