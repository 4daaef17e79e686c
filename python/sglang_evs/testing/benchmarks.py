"""The scripts of the checkout's benchmark/ folder as modules, for the tests of their measurements."""

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[3]  # python/sglang_evs/testing -> the checkout


def load_benchmark(name: str) -> ModuleType:
    """A script of benchmark/ (``name`` without .py) imported as a module, for its tests."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmark" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
