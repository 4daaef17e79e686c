"""Architecture name -> our model class, resolved lazily (only where SGLang builds a model).

The upstream class objects stay untouched: Qwen3.5, Qwen3-VL-MoE and others subclass
them. We answer SGLang's model lookup for these names instead, and register our
processor for their upstream classes.
"""

import importlib
from typing import Any, NamedTuple

from sglang_evs import trace
from sglang_evs.pruning.families import VideoFamily


class Entry(NamedTuple):
    ours: str  # "module:Class" under sglang_evs.models
    upstream: str  # the upstream class's name in sglang_compat


# The architectures this project serves (their forward calls this project's embedding routine); every
# other architecture is SGLang's own class calling SGLang's own routine (test/models/test_registry.py).
MODELS: dict[str, Entry] = {
    "Qwen3VLForConditionalGeneration": Entry("qwen3_vl:Qwen3VLForConditionalGeneration", "UpstreamQwen3VL"),
    "Qwen3VLMoeForConditionalGeneration": Entry("qwen3_vl:Qwen3VLMoeForConditionalGeneration", "UpstreamQwen3VLMoe"),
    "Qwen3_5ForConditionalGeneration": Entry("qwen3_5:Qwen3_5ForConditionalGeneration", "UpstreamQwen3_5"),
    "Qwen3_5MoeForConditionalGeneration": Entry("qwen3_5:Qwen3_5MoeForConditionalGeneration", "UpstreamQwen3_5Moe"),
    "Qwen2_5_VLForConditionalGeneration": Entry("qwen2_vl:Qwen2_5_VLForConditionalGeneration", "UpstreamQwen2_5_VL"),
    "Qwen2VLForConditionalGeneration": Entry("qwen2_vl:Qwen2VLForConditionalGeneration", "UpstreamQwen2VL"),
    # Qwen3-Omni: its thinker (a Qwen3-VL-MoE with an audio tower) prunes; audio never
    "Qwen3OmniMoeForConditionalGeneration": Entry(
        "qwen3_omni:Qwen3OmniMoeForConditionalGeneration", "UpstreamQwen3Omni"
    ),
    "Qwen4ExpForConditionalGeneration": Entry("qwen4_exp:Qwen4ExpForConditionalGeneration", "UpstreamQwen4Exp"),
    # GLM-4.1V / GLM-4.5V: their own processor and video layout (pruning.families.GLM4V)
    "Glm4vForConditionalGeneration": Entry("glm4v:Glm4vForConditionalGeneration", "UpstreamGlm4v"),
    "Glm4vMoeForConditionalGeneration": Entry("glm4v:Glm4vMoeForConditionalGeneration", "UpstreamGlm4vMoe"),
}


# Architectures whose prefill upstream keeps eager and the plugin leaves so (the others it serves join SGLang's
# breakable prefill-graph allowlist, `plugin.py`): Qwen3-Omni, whose graph-mode suite has not been run.
EAGER_PREFILL = ("Qwen3OmniMoeForConditionalGeneration",)


# Speculative drafts that must see what the target sees (SGLang names the draft's architecture itself).
DRAFT_MODELS: dict[str, Entry] = {
    "Qwen3_5ForCausalLMMTP": Entry("qwen3_5:Qwen3_5MTP", "UpstreamQwen3_5MTP"),
    "Qwen4ExpForCausalLMMTP": Entry("qwen4_exp:Qwen4ExpMTP", "UpstreamQwen4ExpMTP"),
}
# Drafts that see it already, answered only where positions are traced (to record what they were handed).
TRACED_DRAFT_MODELS: dict[str, Entry] = {
    "LlamaForCausalLMEagle3": Entry("eagle3:Eagle3Draft", "UpstreamLlamaEagle3"),
}


def model_class(architecture: str) -> Any | None:
    """Our class for a target architecture (`MODELS`); None for one we leave to SGLang."""
    return _load(MODELS.get(architecture))


def _load(entry: Entry | None) -> Any | None:
    if entry is None:
        return None
    module_name, _, class_name = entry.ours.partition(":")
    return getattr(importlib.import_module(f"sglang_evs.models.{module_name}"), class_name)


def prunes_videos(architecture: str | None) -> bool:
    """Whether the plugin prunes this architecture's videos: it does for every model it serves."""
    return architecture in MODELS


def pruned_by_sglang(architecture: str) -> bool:
    """Whether SGLang prunes this architecture's videos itself: its model is built on SGLang's own EVS
    (`sglang.srt.multimodal.evs.EVS`, rate from the config's `video_pruning_rate`, as Nemotron-Nano-VL)."""
    from sglang_evs import sglang_compat

    cls = sglang_compat.ModelRegistry.models.get(architecture)
    return isinstance(cls, type) and issubclass(cls, sglang_compat.SGLangEVS)


def pruned_families() -> dict[Any, VideoFamily]:
    """Upstream model class -> its videos' family, for every class whose processor is the pruning one."""
    from sglang_evs import sglang_compat

    return {sglang_compat.resolve(entry.upstream): model_class(name).video_family for name, entry in MODELS.items()}


def resolve_model_cls_around(original, registry, architectures):
    """AROUND hook on SGLang's `_ModelRegistry.resolve_model_cls`."""
    first = architectures if isinstance(architectures, str) else (architectures or [None])[0]
    traced = TRACED_DRAFT_MODELS.get(first) if trace.positions_enabled() else None
    cls = _load(MODELS.get(first) or DRAFT_MODELS.get(first) or traced) if first else None
    return (cls, first) if cls is not None else original(registry, architectures)
