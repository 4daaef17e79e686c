"""A meta-path finder that applies the CPU fixes lazily, at the import that needs them.

1. `sgl_kernel`: no CPU build is on PyPI; serve the stand-in `sgl_kernel_cpu`,
   and `sgl_kernel.mamba` as `sgl_kernel_mamba` (Qwen3.5's Gated DeltaNet).
2. `torchvision`: PyPI's wheel is a CUDA build whose `_C.so` fails to load on
   CPU torch; its meta registrations then die on the missing `torchvision::nms`
   (this also breaks `import transformers` models). After torchvision tried to
   load its ops, define the missing schemas (and a CPU nms). Independent of SGLang.
3. `sglang.srt.models.qwen3_5` (imported by the Qwen-VL processor) looks up
   `torch.ops.sgl_kernel.*_cpu` ops at import; register those op names first,
   or the processor silently fails to register. The Gated DeltaNet backend
   modules look up (and later call) two more ops at import.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

STAND_IN_MODULES = {
    "sgl_kernel": "sglang_evs.runtime.sgl_kernel_cpu",
    "sgl_kernel.mamba": "sglang_evs.runtime.sgl_kernel_mamba",
}


def _prepare_torchvision() -> None:
    from sglang_evs.runtime.torch_ops import define_missing_torchvision_ops

    define_missing_torchvision_ops()


def _prepare_sgl_kernel_ops() -> None:
    from sglang_evs.runtime.torch_ops import define_sgl_kernel_ops

    define_sgl_kernel_ops()


# module name -> work to do before that module is imported
ALWAYS_BEFORE_IMPORT: dict[str, Callable[[], None]] = {
    "torchvision._meta_registrations": _prepare_torchvision,
}
SGLANG_CPU_BEFORE_IMPORT: dict[str, Callable[[], None]] = {
    "sglang.srt.models.qwen3_5": _prepare_sgl_kernel_ops,
    "sglang.srt.layers.attention.linear.kernels.gdn_triton": _prepare_sgl_kernel_ops,
    "sglang.srt.layers.attention.linear.gdn_backend": _prepare_sgl_kernel_ops,
}


class _AliasLoader(importlib.abc.Loader):
    """Loads a stand-in module under an `sgl_kernel` name."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(STAND_IN_MODULES[spec.name])
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module: ModuleType) -> None:
        pass


class CpuImportFixes(importlib.abc.MetaPathFinder):
    def __init__(self, sglang_fixes: bool) -> None:
        self.sglang_fixes = sglang_fixes
        self._before_import = dict(ALWAYS_BEFORE_IMPORT)
        if sglang_fixes:
            self._before_import.update(SGLANG_CPU_BEFORE_IMPORT)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in STAND_IN_MODULES and self.sglang_fixes:
            # `sgl_kernel` is a package (empty __path__) so that `sgl_kernel.mamba`
            # resolves here; any other submodule is not found (ImportError).
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(), is_package=fullname == "sgl_kernel")
        prepare = self._before_import.pop(fullname, None)
        if prepare is not None:
            prepare()
        return None  # let the regular finders import the real module
