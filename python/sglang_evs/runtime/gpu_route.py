"""The GPU route: SGLang 0.5.23 on CUDA without `sglang-kernel` (sgl_kernel) and without flashinfer.

Activated in every process by `bootstrap` (the `.pth` of `sglang-evs-gpu-route`, scripts/gpu_route/setup.py)
when `SGLANG_EVS_GPU_ROUTE=1`, the CPU engine is off and no real `sgl_kernel` is importable. It then
- serves `sgl_kernel` and the submodules SGLang imports on CUDA from `runtime/sgl_kernel_torch.py`
  (pure torch, graph-capturable); any other name or submodule is absent, so SGLang's fallbacks apply;
- sets `SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1` (the launcher would refuse to start without the sglang-kernel
  distribution) and `SGLANG_FORCE_FUSED_OP_BACKEND=torch`, unless set: every `BaseFusedOp` of SGLang (RMSNorm,
  SiluAndMul, RotaryEmbedding and MRoPE, clamp_position, ...) runs its own `forward_native`, so nothing reaches
  a JIT-compiled (nvcc) kernel or an `sgl_kernel` op through them;
- refuses every JIT (nvcc) kernel build, and answers "no" to the JIT probes SGLang makes on every call on this
  path (the KV-cache store, the q/k norms, the gated activations' vector path): SGLang's torch or Triton code
  then runs instead, and never builds the Blackwell-only CuTe DSL dual GEMM (`AFTER_IMPORT`).

flashinfer is never provided: with it absent, `is_flashinfer_available()` is False and SGLang's lazy
imports of it are never resolved on this path. The server flags the route serves with are `SERVER_ARGS`.

`python -m sglang_evs.runtime.gpu_route_check` runs on any machine, a CPU one included:
it imports the Qwen3-VL CUDA server path through this hook and reports each `sgl_kernel` name asked for.
"""

import argparse
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

ROUTE_ENV = "SGLANG_EVS_GPU_ROUTE"

# The flags a server takes on this route (added to the model, port and dtype flags of the caller). The prefill
# graph backend is left to SGLang's default on CUDA (breakable, for the multimodal architectures on its
# allowlist, which the plugin extends); decode CUDA graphs are on by default.
SERVER_ARGS: tuple[str, ...] = (
    "--device", "cuda",
    "--attention-backend", "triton",          # SGLang's Triton kernels: no flashinfer, no sgl_kernel
    "--mm-attention-backend", "triton_attn",  # the vision tower: Triton too (the Hopper default fa3 is sgl_kernel's)
    "--sampling-backend", "pytorch",          # the default would be flashinfer's sampler where installed
    "--disable-custom-all-reduce",            # sgl_kernel's all-reduce kernels (only with tp > 1)
    "--bf16-gemm-backend", "torch",           # bfloat16 linears through torch (auto picks CuTe DSL on Blackwell)
    "--disable-flashinfer-autotune",          # no flashinfer to tune: off by flag, not left to its heuristics
)  # fmt: skip

# Set in each process of the route unless the caller set them.
ENVIRONMENT: dict[str, str] = {
    "SGLANG_FORCE_FUSED_OP_BACKEND": "torch",  # every BaseFusedOp runs its forward_native
    # the launcher asserts that the sglang-kernel distribution (>= 0.4.9) is installed on CUDA; it is not here
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
    # SGLang's bundled Rust radix-tree core is built against torch 2.14.1; under torch 2.11 (the GPU machine's)
    # its first insert panics ("Unsupported TypeMeta in ATen", seen in the CPU rehearsal): SGLang's Python core
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
}

# "sgl_kernel.<name>" or "sgl_kernel.<submodule>" -> the SGLang modules that asked for it (this process)
ASKED: dict[str, set[str]] = {}
# the modules of AFTER_IMPORT whose fix ran (this process)
APPLIED: set[str] = set()


def wanted() -> bool:
    """The route is on: asked for, not the CPU engine, and no real sgl_kernel to use instead."""
    if os.environ.get(ROUTE_ENV) != "1" or os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        return False
    if any(isinstance(finder, GpuImportFixes) for finder in sys.meta_path):
        return True
    from sglang_evs.runtime.import_fixes import sgl_kernel_installed

    return not sgl_kernel_installed()


def _asker() -> str:
    """The SGLang module whose import (or call) is running: the nearest `sglang.*` frame."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("sglang.") or name == "sglang":
            return name
        frame = frame.f_back
    return "?"


def _record(name: str) -> None:
    ASKED.setdefault(name, set()).add(_asker())


class StandInModule(ModuleType):
    """One module of the stand-in `sgl_kernel` package; every name looked up on it is recorded in `ASKED`."""

    def __init__(self, name: str) -> None:
        from sglang_evs.runtime.sgl_kernel_torch import names_of

        super().__init__(name)
        self.__path__: list[str] = []  # a package: `sgl_kernel.<sub>` is looked up through the finder
        self._names = names_of(name)

    def __getattr__(self, attr: str):
        if attr.startswith("__") or attr == "_names":
            raise AttributeError(attr)
        _record(f"{self.__name__}.{attr}")
        try:
            return self._names[attr]
        except KeyError:
            raise AttributeError(f"module {self.__name__!r} (sglang-evs GPU route) has no attribute {attr!r}") from None

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._names})


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return StandInModule(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        pass


def _refuse_jit_builds(module: ModuleType) -> None:
    """`sglang.kernels.jit.utils.compile.loader` (before anything imports `load_jit` from it): a JIT kernel is
    never compiled on this route (no nvcc is assumed, and no sgl_kernel headers). SGLang's `can_use_*` probes
    catch the error and take their torch or Triton path; an unguarded JIT call fails naming its kernel, once
    and at once, instead of SGLang retrying the build on every call (its `cache_once` keeps only successes)."""

    def load_jit(*args: str, **kwargs) -> None:
        raise RuntimeError(f"sglang-evs GPU route: JIT kernel {'/'.join(args)!r} is not built on this route")

    module.load_jit = load_jit


def _store_cache_by_indexing(module: ModuleType) -> None:
    """`sglang.kernels.ops.kvcache.kvcache`: KV-cache writes take SGLang's indexed-assignment path (the probe
    would otherwise try the JIT build, and log its failure, on every write)."""

    def can_use_store_cache(k_row_bytes: int, v_row_bytes: int = 0, num_threads: int = 0) -> bool:
        return False

    module.can_use_store_cache = can_use_store_cache


def _qk_norm_without_jit(module: ModuleType) -> None:
    """`sglang.kernels.ops.layernorm.norm`: Qwen3's q/k norms (`models/utils.apply_qk_norm`) and the vision
    tower's take SGLang's RMSNorm, not the JIT in-place kernel (probed, and its failure logged, on every call)."""

    def can_use_fused_inplace_qknorm(head_dim: int, dtype) -> bool:
        return False

    module.can_use_fused_inplace_qknorm = can_use_fused_inplace_qknorm


def _gated_activations_without_jit(module: ModuleType) -> None:
    """`sglang.srt.layers.activation`: its module-level silu/gelu-and-mul call the sgl_kernel stand-ins, never
    the JIT kernel (they are reached only by direct calls: the layers run forward_native on this route)."""

    def jit_act_supported(out) -> bool:
        return False

    module._jit_act_supported = jit_act_supported


def _dense_mlp_without_dual_gemm(module: ModuleType) -> None:
    """`sglang.srt.layers.dual_gemm`: every dense MLP (Qwen2/Qwen3's included) builds a `DualGemm`, whose mode
    probe imports SGLang's CuTe DSL kernel on CUDA, and with it `cutlass` (nvidia-cutlass-dsl, not carried: the
    kernel is Blackwell's tcgen05 only). No mode means SGLang's own gate/up projection and activation run."""

    def select_no_mode(self, gate_up_proj, hidden_size: int) -> None:
        return None

    module.DualGemm._select_mode = select_no_mode


# Fixes applied to a module right after it executed, before the module importing it reads its names.
AFTER_IMPORT: dict[str, Callable[[ModuleType], None]] = {
    "sglang.kernels.jit.utils.compile.loader": _refuse_jit_builds,
    "sglang.kernels.ops.kvcache.kvcache": _store_cache_by_indexing,
    "sglang.kernels.ops.layernorm.norm": _qk_norm_without_jit,
    "sglang.srt.layers.activation": _gated_activations_without_jit,
    "sglang.srt.layers.dual_gemm": _dense_mlp_without_dual_gemm,
}


class GpuImportFixes(importlib.abc.MetaPathFinder):
    """Serves the stand-in `sgl_kernel` package and applies `AFTER_IMPORT` to the modules it names."""

    def __init__(self) -> None:
        from sglang_evs.runtime.sgl_kernel_torch import MODULES

        self._modules = frozenset(MODULES)
        self._after_import = dict(AFTER_IMPORT)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "sgl_kernel" or fullname.startswith("sgl_kernel."):
            if fullname != "sgl_kernel":
                _record(fullname)
            if fullname in self._modules:
                return importlib.machinery.ModuleSpec(fullname, _StandInLoader(), is_package=True)
            return None  # not found: `sgl_kernel.__path__` is empty, so this is a ModuleNotFoundError
        if fullname == "flashinfer" or fullname.startswith("flashinfer."):
            _record(fullname)
            return None
        fix = self._after_import.pop(fullname, None)
        if fix is not None:

            def finish(module: ModuleType) -> None:
                fix(module)
                APPLIED.add(module.__name__)

            from sglang_evs.runtime.import_fixes import spec_then

            return spec_then(self, fullname, path, target, finish)
        return None


def install() -> None:
    """Put the route's finder first on `sys.meta_path` (once) and its environment in place."""
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if not any(isinstance(finder, GpuImportFixes) for finder in sys.meta_path):
        sys.meta_path.insert(0, GpuImportFixes())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_evs.runtime.gpu_route", description=__doc__.split("\n")[0])
    parser.add_argument("--print-server-args", action="store_true", help="print SERVER_ARGS, one line")
    args = parser.parse_args(argv)
    if args.print_server_args:
        print(" ".join(SERVER_ARGS))
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
