"""The one place that knows SGLang's internals.

Every other module reaches SGLang through the names defined here, so moving
to another SGLang release means reading this file against the new source.
`check_sglang_compatibility()` runs when the plugin loads and refuses, loudly,
any SGLang version or layout this package was not written against.
"""

import importlib
import importlib.metadata

SUPPORTED_SGLANG_VERSION = "0.5.23"

# Internals this package relies on: (module, attribute or None for the module itself).
REQUIRED_INTERNALS: tuple[tuple[str, str | None], ...] = (
    ("sglang.srt.plugins.hook_registry", "HookRegistry"),
    ("sglang.srt.plugins.hook_registry", "HookType"),
    ("sglang.srt.models.registry", "ModelRegistry"),
)


class UnsupportedSGLangError(RuntimeError):
    """Raised at startup when the installed SGLang is not the one this plugin supports."""


def installed_sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def missing_internals() -> list[str]:
    missing = []
    for module_name, attr in REQUIRED_INTERNALS:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing.append(f"{module_name} ({exc})")
            continue
        if attr is not None and not hasattr(module, attr):
            missing.append(f"{module_name}.{attr}")
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
