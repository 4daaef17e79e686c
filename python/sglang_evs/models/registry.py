"""Architecture name -> our model class, resolved lazily (only where SGLang builds a model).

The upstream class objects stay untouched: Qwen3.5, Qwen3-VL-MoE and others subclass
them. We answer SGLang's model lookup for these names instead, and register our
processor for their upstream classes.
"""

import importlib
from typing import Any

# architecture -> (our class "module:Class", the upstream class's name in sglang_compat)
MODELS = {
    "Qwen3VLForConditionalGeneration": (
        "sglang_evs.models.qwen3_vl:Qwen3VLForConditionalGeneration",
        "UpstreamQwen3VL",
    ),
    "Qwen3VLMoeForConditionalGeneration": (
        "sglang_evs.models.qwen3_vl:Qwen3VLMoeForConditionalGeneration",
        "UpstreamQwen3VLMoe",
    ),
    "Qwen2_5_VLForConditionalGeneration": (
        "sglang_evs.models.qwen2_vl:Qwen2_5_VLForConditionalGeneration",
        "UpstreamQwen2_5_VL",
    ),
    "Qwen2VLForConditionalGeneration": (
        "sglang_evs.models.qwen2_vl:Qwen2VLForConditionalGeneration",
        "UpstreamQwen2VL",
    ),
}


def model_class(architecture: str) -> Any | None:
    entry = MODELS.get(architecture)
    if entry is None:
        return None
    module_name, _, class_name = entry[0].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def upstream_classes() -> list[Any]:
    from sglang_evs import sglang_compat

    return [sglang_compat.resolve(upstream) for _, upstream in MODELS.values()]


def resolve_model_cls_around(original, registry, architectures):
    """AROUND hook on SGLang's `_ModelRegistry.resolve_model_cls`."""
    first = architectures if isinstance(architectures, str) else (architectures or [None])[0]
    cls = model_class(first) if first else None
    return (cls, first) if cls is not None else original(registry, architectures)
