"""Qwen3-VL and Qwen3-VL-MoE adapters: deepstack levels in the fixed buffers, videos prunable.

The family's specifics: upstream's Qwen3 language models (which add deepstack level i after
decoder layer i), the vision tower's deepstack levels, and video rows [main | deepstack...]
that the keep-mask scores together. Everything else is `models/adapter.py`.
"""

from sglang_evs import sglang_compat as sglang
from sglang_evs.models import adapter
from sglang_evs.models.graph_inputs import ReadsGraphInputs


class Qwen3LLMModel(ReadsGraphInputs, sglang.UpstreamQwen3LLMModel):
    pass


class Qwen3MoeLLMModel(ReadsGraphInputs, sglang.UpstreamQwen3MoeLLMModel):
    pass


class Qwen3VLForConditionalGeneration(sglang.UpstreamQwen3VL):
    implements_post_process_contract = True

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix, sglang.UpstreamQwen3LLMModel)
        adapter.attach(self, Qwen3LLMModel, self.num_deepstack_embeddings, super().get_video_feature)

    def get_video_feature(self, items):
        return self.pruned_videos.features(items)

    def post_process(self, fetched, layout):
        return adapter.post_process(self, fetched, layout)

    def forward(self, input_ids, positions, forward_batch, get_embedding=False, pp_proxy_tensors=None):
        if self.language_model_only:
            return super().forward(input_ids, positions, forward_batch, get_embedding, pp_proxy_tensors)
        return adapter.forward(self, input_ids, positions, forward_batch, get_embedding, pp_proxy_tensors)


class Qwen3VLMoeForConditionalGeneration(sglang.UpstreamQwen3VLMoe):
    implements_post_process_contract = True

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix, sglang.UpstreamQwen3MoeLLMModel)
        adapter.attach(self, Qwen3MoeLLMModel, self.num_deepstack_embeddings, super().get_video_feature)

    def get_video_feature(self, items):
        return self.pruned_videos.features(items)

    def post_process(self, fetched, layout):
        return adapter.post_process(self, fetched, layout)

    def forward(self, input_ids, positions, forward_batch, get_embedding=False, pp_proxy_tensors=None):
        if self.language_model_only:
            return super().forward(input_ids, positions, forward_batch, get_embedding, pp_proxy_tensors)
        return adapter.forward(self, input_ids, positions, forward_batch, get_embedding, pp_proxy_tensors)


EntryClass = [Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration]
