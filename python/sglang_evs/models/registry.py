"""Architecture name -> our model class, resolved lazily (only where SGLang builds a model).

The upstream class objects stay untouched: Qwen3.5, Qwen3-VL-MoE and others subclass
them. We answer SGLang's model lookup for the architectures `served.SERVED` records (and their
drafts) instead, and register our processor for their upstream classes.
"""

import importlib
from typing import Any

from sglang_evs import trace
from sglang_evs.served import EAGLE3_DRAFT, MTP_DRAFTS, SERVED, Draft, VideoFamily


def model_class(architecture: str) -> Any | None:
    """Our class for a target architecture (`served.SERVED`); None for one we leave to SGLang."""
    model = SERVED.get(architecture)
    return None if model is None else _load(model.module, architecture)


def draft_class(draft: Draft) -> Any:
    module_name, _, class_name = draft.ours.partition(":")
    return _load(module_name, class_name)


def _load(module_name: str, class_name: str) -> Any:
    return getattr(importlib.import_module(f"sglang_evs.models.{module_name}"), class_name)


def prunes_videos(architecture: str | None) -> bool:
    """Whether the plugin prunes this architecture's videos: it does for every model it serves."""
    return architecture in SERVED


def pruned_by_sglang(architecture: str) -> bool:
    """Whether SGLang prunes this architecture's videos itself: its model is built on SGLang's own EVS
    (`sglang.srt.multimodal.evs.EVS`, rate from the config's `video_pruning_rate`, as Nemotron-Nano-VL)."""
    from sglang_evs import sglang_compat

    cls = sglang_compat.ModelRegistry.models.get(architecture)
    return isinstance(cls, type) and issubclass(cls, sglang_compat.SGLangEVS)


def pruned_families() -> dict[Any, VideoFamily]:
    """Upstream model class -> its videos' family, for every class whose processor is the pruning one."""
    from sglang_evs import sglang_compat

    return {sglang_compat.resolve(model.upstream): model.family for model in SERVED.values()}


def resolve_model_cls_around(original, registry, architectures):
    """AROUND hook on SGLang's `_ModelRegistry.resolve_model_cls`: our class for a served architecture and for
    the MTP draft of one; for the EAGLE3 draft only where positions are traced (to record what it was handed)."""
    first = architectures if isinstance(architectures, str) else (architectures or [None])[0]
    traced = first == EAGLE3_DRAFT.architecture and trace.positions_enabled()
    draft = MTP_DRAFTS.get(first) or (EAGLE3_DRAFT if traced else None)
    cls = model_class(first) if first in SERVED else draft_class(draft) if draft is not None else None
    return (cls, first) if cls is not None else original(registry, architectures)
