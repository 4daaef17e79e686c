"""GLM-4.1V and GLM-4.5V adapters: videos prunable through GLM's own processor, positions in the fixed buffers.

The family's specifics: SGLang's GLM-4 language models (dense and MoE), no deepstack, and GLM's video
layout (`served.GLM4V`, its records' family): each temporal group an image-token run followed by its second,
the positions from upstream's `get_rope_index_glm4v` (each group its own grid with t = 1). Everything else
is `models/adapter.py`.
"""

from sglang_evs import sglang_compat as sglang
from sglang_evs.models.adapter import AdaptedModel
from sglang_evs.models.graph_inputs import ReadsGraphInputs


class Glm4Model(ReadsGraphInputs, sglang.UpstreamGlm4Model):
    pass


class Glm4MoeModel(ReadsGraphInputs, sglang.UpstreamGlm4MoeModel):
    pass


class Glm4vForConditionalGeneration(AdaptedModel, sglang.UpstreamGlm4v):
    language_model_cls = Glm4Model


class Glm4vMoeForConditionalGeneration(AdaptedModel, sglang.UpstreamGlm4vMoe):
    language_model_cls = Glm4MoeModel


EntryClass = [Glm4vForConditionalGeneration, Glm4vMoeForConditionalGeneration]
