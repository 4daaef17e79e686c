"""Architecture name -> our model class, resolved lazily (only where SGLang builds a model).

The upstream Qwen3-VL class objects stay untouched: Qwen3.5, Qwen3-VL-MoE and
others subclass them. We answer SGLang's model lookup for these names instead.
"""

import importlib
from typing import Any

MODELS = {
    "Qwen3VLForConditionalGeneration": "sglang_evs.models.qwen3_vl:Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration": "sglang_evs.models.qwen3_vl:Qwen3VLMoeForConditionalGeneration",
}


def model_class(architecture: str) -> Any | None:
    path = MODELS.get(architecture)
    if path is None:
        return None
    module_name, _, class_name = path.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def resolve_model_cls_around(original, registry, architectures):
    """AROUND hook on SGLang's `_ModelRegistry.resolve_model_cls`."""
    first = architectures if isinstance(architectures, str) else (architectures or [None])[0]
    cls = model_class(first) if first else None
    return (cls, first) if cls is not None else original(registry, architectures)
