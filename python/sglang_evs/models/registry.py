"""Architecture name -> our model class, resolved lazily (only where SGLang builds a model).

The upstream class objects stay untouched: Qwen3.5, Qwen3-VL-MoE and others subclass
them. We answer SGLang's model lookup for the architectures `served.SERVED` records, and for a draft
only where the server's target is one of them (SGLang builds the same draft classes for other targets:
`Qwen3_5ForCausalLMMTP` for InternS2 and the text-only Qwen3.5 too), and register our processor for their
upstream classes.
"""

import importlib
from typing import Any

from sglang_evs import trace
from sglang_evs.pruning.refusals import server_checkpoint
from sglang_evs.served import EAGLE3_DRAFT, SERVED, Draft, VideoFamily, mtp_draft_of


def model_class(architecture: str) -> Any | None:
    """Our class for a target architecture (`served.SERVED`); None for one we leave to SGLang."""
    model = SERVED.get(architecture)
    return None if model is None else _load(model.module, architecture)


def draft_class(draft: Draft) -> Any:
    module_name, _, class_name = draft.ours.partition(":")
    return _load(module_name, class_name)


def _load(module_name: str, class_name: str) -> Any:
    return getattr(importlib.import_module(f"sglang_evs.models.{module_name}"), class_name)


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
    """AROUND hook on SGLang's `_ModelRegistry.resolve_model_cls`: our class for a served architecture, and for
    a draft where the server's target is served and the draft is ours for it (`draft_for_target`)."""
    first = architectures if isinstance(architectures, str) else (architectures or [None])[0]
    if first in SERVED:
        return model_class(first), first
    draft = draft_for_target(first, server_target())
    return (draft_class(draft), first) if draft is not None else original(registry, architectures)


def draft_for_target(architecture: str | None, target: str | None) -> Draft | None:
    """Our draft answering `architecture` on a server whose target is `target`: the NEXTN draft the target's
    record names (`served.mtp_draft_of`), or the EAGLE3 draft where positions are traced (to record what it was
    handed), for a served target only. None: SGLang's own class (any other target, or none known)."""
    if target not in SERVED:
        return None
    mtp = mtp_draft_of(target)
    if mtp is not None and mtp.architecture == architecture:
        return mtp
    traced = architecture == EAGLE3_DRAFT.architecture and trace.positions_enabled()
    return EAGLE3_DRAFT if traced else None


def server_target() -> str | None:
    """The first architecture of the checkpoint this process serves (the target a draft is built beside, in the
    draft worker too); None outside a server."""
    return (server_checkpoint().get("architectures") or [None])[0]
