"""The scripts of the checkout's benchmark/ folder as modules, for the tests of their measurements."""

import importlib.util
from pathlib import Path
from types import ModuleType


def checkout() -> Path:
    """The checkout whose benchmark/ folder the tests load: the one this package lives in (an editable install),
    else the working directory (a wheel install run from the checkout, as on the GPU machine)."""
    for candidate in (Path(__file__).resolve().parents[3], Path.cwd()):
        if (candidate / "benchmark").is_dir():
            return candidate
    raise FileNotFoundError("no benchmark/ folder beside the sglang_evs package or in the working directory")


def load_benchmark(name: str) -> ModuleType:
    """A script of benchmark/ (``name`` without .py) imported as a module, for its tests."""
    spec = importlib.util.spec_from_file_location(name, checkout() / "benchmark" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
