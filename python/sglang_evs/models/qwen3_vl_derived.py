"""Other SGLang architectures that run upstream Qwen3-VL's forward: the generic routine, no EVS.

Upstream hands their deepstack to the embedding routine through its legacy `use_deepstack`
argument, which this project's routine does not take; so each is answered by a class here
that splits deepstack off in `post_process` into the fixed buffer, as for Qwen3-VL. Their
processors are not the pruning one (Intern-S1-Pro has its own; the others are untested with
EVS), so their videos are never pruned.
"""

from sglang_evs import sglang_compat as sglang
from sglang_evs.models.adapter import AdaptedModel
from sglang_evs.models.graph_inputs import ReadsGraphInputs
from sglang_evs.models.qwen3_5 import Qwen3_5MoeLLMModel
from sglang_evs.models.qwen3_vl import Qwen3LLMModel


class InternS1ProTextModel(ReadsGraphInputs, sglang.UpstreamInternS1ProTextModel):
    pass


class InternS2MobiusLLMModel(ReadsGraphInputs, sglang.UpstreamInternS2MobiusLLMModel):
    pass


class InternS1ProForConditionalGeneration(AdaptedModel, sglang.UpstreamInternS1Pro):
    language_model_cls = InternS1ProTextModel
    prunes_videos = False


class InternS2MobiusForConditionalGeneration(AdaptedModel, sglang.UpstreamInternS2Mobius):
    language_model_cls = InternS2MobiusLLMModel
    prunes_videos = False


class InternS2PreviewForConditionalGeneration(AdaptedModel, sglang.UpstreamInternS2Preview):
    language_model_cls = Qwen3_5MoeLLMModel
    prunes_videos = False


class Cosmos3ForConditionalGeneration(AdaptedModel, sglang.UpstreamCosmos3):
    language_model_cls = Qwen3LLMModel
    prunes_videos = False


EntryClass = [
    InternS1ProForConditionalGeneration,
    InternS2MobiusForConditionalGeneration,
    InternS2PreviewForConditionalGeneration,
    Cosmos3ForConditionalGeneration,
]
