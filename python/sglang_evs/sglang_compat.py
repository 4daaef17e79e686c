"""The one place that knows SGLang's internals.

Every other module reaches SGLang through the names defined here
(`sglang_compat.NAME`, resolved on first use), so moving to another SGLang
release means reading this file against the new source.
`check_sglang_compatibility()` runs when the plugin loads and refuses, loudly,
any SGLang version or layout this package was not written against.
"""

import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

SUPPORTED_SGLANG_VERSION = "0.5.23"

# name used in this package -> "module:attribute" in SGLang 0.5.23
INTERNALS: dict[str, str] = {
    # plugin machinery
    "HookRegistry": "sglang.srt.plugins.hook_registry:HookRegistry",
    "HookType": "sglang.srt.plugins.hook_registry:HookType",
    "ModelRegistry": "sglang.srt.models.registry:ModelRegistry",
    "BREAKABLE_CUDA_GRAPH_MM_ARCHS": (
        "sglang.srt.configs.model_config:multimodal_breakable_cuda_graph_supported_model_archs"
    ),
    # the multimodal embedding routine we replace, and what ours builds on
    "general_mm_embed_routine": "sglang.srt.managers.mm_utils:general_mm_embed_routine",
    "get_embedding_and_mask": "sglang.srt.managers.mm_schedule:get_embedding_and_mask",
    "scatter_mm_embedding": "sglang.srt.managers.mm_utils:_scatter_mm_embedding",
    "mm_schedule": "sglang.srt.managers.mm_schedule:",
    "Modality": "sglang.srt.managers.schedule_batch:Modality",
    "ForwardBatch": "sglang.srt.model_executor.forward_batch_info:ForwardBatch",
    "get_disagg": "sglang.srt.runtime_context:get_disagg",
    "get_server_args": "sglang.srt.runtime_context:get_server_args",
    # multimodal processors (tokenizer process)
    "UpstreamQwenVLProcessor": "sglang.srt.multimodal.processors.qwen_vl:QwenVLImageProcessor",
    "PROCESSOR_MAPPING": "sglang.srt.managers.multimodal_processor:PROCESSOR_MAPPING",
    # Qwen3-VL
    "UpstreamQwen3VL": "sglang.srt.models.qwen3_vl:Qwen3VLForConditionalGeneration",
    "UpstreamQwen3LLMModel": "sglang.srt.models.qwen3_vl:Qwen3LLMModel",
    "UpstreamQwen3VLMoe": "sglang.srt.models.qwen3_vl_moe:Qwen3VLMoeForConditionalGeneration",
    "UpstreamQwen3MoeLLMModel": "sglang.srt.models.qwen3_vl_moe:Qwen3MoeLLMModel",
    # EVS maths (pure torch), used by sglang_evs.evs through resolve_file()
    "evs_core": "sglang.srt.multimodal.evs.evs_core:",
}
# hook target (dotted path) of the routine the plugin replaces
EMBED_ROUTINE_TARGET = "sglang.srt.managers.mm_utils.general_mm_embed_routine"

# Checked at startup; the Qwen3-VL names are checked when those models load.
STARTUP_INTERNALS = ("HookRegistry", "HookType", "ModelRegistry", "general_mm_embed_routine", "get_embedding_and_mask")


class UnsupportedSGLangError(RuntimeError):
    """Raised at startup when the installed SGLang is not the one this plugin supports."""


def resolve(name: str) -> Any:
    module_name, _, attr = INTERNALS[name].partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


_FILE_MODULES: dict[str, ModuleType] = {}


def resolve_file(name: str) -> Any:
    """Like `resolve`, but loads the module from its own file when it is not imported yet.

    For leaf modules that import only torch, such as `evs_core`, whose package
    `__init__` imports the scheduler (about 8 s and 4,800 modules on the CPU
    machine).  Inside a server the module is already in `sys.modules` and that
    one is used.
    """
    module_name, _, attr = INTERNALS[name].partition(":")
    module = sys.modules.get(module_name) or _FILE_MODULES.get(module_name)
    if module is None:
        top, *parts = module_name.split(".")
        spec = importlib.util.find_spec(top)  # a top-level find_spec runs no package code
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"{top} is not installed (needed for {module_name})")
        path = Path(next(iter(spec.submodule_search_locations)), *parts).with_suffix(".py")
        file_spec = importlib.util.spec_from_file_location(module_name, path)
        if not path.is_file() or file_spec is None or file_spec.loader is None:
            raise ImportError(f"{module_name} not found at {path}")
        module = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
        _FILE_MODULES[module_name] = module
    return getattr(module, attr) if attr else module


def __getattr__(name: str) -> Any:
    if name in INTERNALS:
        return resolve(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def installed_sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def missing_internals(names: tuple[str, ...] | None = None) -> list[str]:
    missing = []
    for name in STARTUP_INTERNALS if names is None else names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{INTERNALS[name]} ({exc})")
    return missing


def check_sglang_compatibility(version: str | None = None) -> str:
    """Return the SGLang version, or raise UnsupportedSGLangError naming found and supported versions."""
    found = installed_sglang_version() if version is None else version
    if found != SUPPORTED_SGLANG_VERSION:
        raise UnsupportedSGLangError(
            f"sglang-evs supports SGLang {SUPPORTED_SGLANG_VERSION} only, but found SGLang {found}. "
            f"Install sglang=={SUPPORTED_SGLANG_VERSION} or uninstall sglang-evs."
        )
    missing = missing_internals()
    if missing:
        raise UnsupportedSGLangError(
            f"sglang-evs: SGLang {found} lacks internals this plugin needs "
            f"(supported: SGLang {SUPPORTED_SGLANG_VERSION}): {', '.join(missing)}"
        )
    return found
