"""Qwen2.5-VL and Qwen2-VL adapters: videos prunable, positions in the fixed buffers.

The family's specifics: SGLang's Qwen2 language model, no deepstack, and a video that is one
run of pads (no framing text between groups). Its M-RoPE positions come from upstream's own
`get_rope_index` in the tokenizer process: temporal position = group time
(`second_per_grid_ts` x `tokens_per_second`) for Qwen2.5-VL, the group index for Qwen2-VL;
pruning deletes the pruned pads' rows from them. Everything else is `models/adapter.py`.
"""

from sglang_evs import sglang_compat as sglang
from sglang_evs.models import adapter
from sglang_evs.models.graph_inputs import ReadsGraphInputs


class Qwen2LLMModel(ReadsGraphInputs, sglang.UpstreamQwen2Model):
    pass


class Qwen2_5_VLForConditionalGeneration(sglang.UpstreamQwen2_5_VL):
    implements_post_process_contract = True

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix)
        adapter.attach(self, Qwen2LLMModel, 0, super().get_video_feature)

    def get_video_feature(self, items):
        return self.pruned_videos.features(items)

    def post_process(self, fetched, layout):
        return adapter.post_process(self, fetched, layout)

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, get_embedding=False,
                pp_proxy_tensors=None):  # fmt: skip
        return adapter.forward(self, input_ids, positions, forward_batch, get_embedding, pp_proxy_tensors)


class Qwen2VLForConditionalGeneration(sglang.UpstreamQwen2VL):
    implements_post_process_contract = True

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix)
        adapter.attach(self, Qwen2LLMModel, 0, super().get_video_feature)

    def get_video_feature(self, items):
        return self.pruned_videos.features(items)

    def post_process(self, fetched, layout):
        return adapter.post_process(self, fetched, layout)

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, get_embedding=False):
        return adapter.forward(self, input_ids, positions, forward_batch, get_embedding)


EntryClass = [Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration]
