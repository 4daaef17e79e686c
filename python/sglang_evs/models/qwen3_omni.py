"""Qwen3-Omni adapter: the thinker's videos prunable; its audio and images never are.

SGLang serves Qwen3-Omni as its thinker: the top-level model builds a Qwen3-VL-MoE subclass with an audio
tower and takes its forward. So the adapter is the thinker (`AdaptedModel` first, given the thinker's config,
where the token ids and the vision config live), and the top-level class builds ours where upstream builds
its own, as upstream's `__init__` does otherwise. The thinker's videos are Qwen-VL videos (one run of pads per
video, no timestamps); their positions are upstream's `get_rope_index_qwen3_omni`, audio and video on one
time axis, computed on the unpruned layout, which pruning deletes rows from. Audio rows carry no deepstack
levels (`adapter._split_deepstack` leaves them whole).
"""

from sglang_evs import sglang_compat as sglang
from sglang_evs.models.adapter import AdaptedModel
from sglang_evs.models.qwen3_vl import Qwen3MoeLLMModel


class Qwen3OmniMoeThinker(AdaptedModel, sglang.UpstreamQwen3OmniThinker):
    language_model_cls = Qwen3MoeLLMModel
    served_as = "Qwen3OmniMoeForConditionalGeneration"  # the wrapper below, whose record is the thinker's


class Qwen3OmniMoeForConditionalGeneration(sglang.UpstreamQwen3Omni):
    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super(sglang.UpstreamQwen3Omni, self).__init__(config)  # upstream's base, as upstream's __init__ calls it
        self.config = config
        self.thinker = Qwen3OmniMoeThinker(config.thinker_config, quant_config=quant_config, prefix=prefix)
        self.enable_talker = False
        self.pad_input_ids = self.thinker.pad_input_ids
        self.forward = self.thinker.forward


EntryClass = [Qwen3OmniMoeForConditionalGeneration]
