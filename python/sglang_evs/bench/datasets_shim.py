"""Let SGLang's benchmark and eval modules import where the `datasets` package is not installed.

SGLang 0.5.23 imports ``datasets`` at the top of ``sglang.benchmark.datasets.mmmu`` (so every
``sglang.bench_serving`` run needs it) and of ``sglang.test.simple_eval_mmmu_vlm``, although only
the hub-backed MMMU dataset uses it. A regular SGLang install has it; the CPU route of this repo
does not. Where it is missing, :func:`ensure_datasets_importable` registers a stand-in module whose
functions raise, so everything that does not load a hub dataset works unchanged.
"""

import importlib.util
import sys
import types


def _missing(*_args, **_kwargs):
    raise ImportError("the `datasets` package is not installed; pip install datasets to load hub datasets")


def ensure_datasets_importable() -> bool:
    """Register the stand-in unless real `datasets` is importable. Returns True if it is the real one."""
    if "datasets" in sys.modules or importlib.util.find_spec("datasets") is not None:
        return getattr(sys.modules.get("datasets"), "__sglang_evs_stub__", False) is False
    stub = types.ModuleType("datasets")
    stub.__sglang_evs_stub__ = True  # type: ignore[attr-defined]
    stub.load_dataset = _missing  # type: ignore[attr-defined]
    stub.concatenate_datasets = _missing  # type: ignore[attr-defined]
    sys.modules["datasets"] = stub
    return False
