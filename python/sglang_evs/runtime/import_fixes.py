"""A meta-path finder that applies the CPU fixes lazily, at the import that needs them.

1. `sgl_kernel`: no CPU build is on PyPI; serve the stand-in `sgl_kernel_cpu`,
   and `sgl_kernel.mamba` as `sgl_kernel_mamba` (Qwen3.5's Gated DeltaNet). Also where PyPI's CUDA build is
   installed (a GPU user's install, run on a CPU machine): with no CUDA driver it cannot load.
2. `torchvision`: PyPI's wheel is a CUDA build whose `_C.so` fails to load on
   CPU torch; its meta registrations then die on the missing `torchvision::nms`
   (this also breaks `import transformers` models). After torchvision tried to
   load its ops, define the missing schemas (and a CPU nms). Independent of SGLang.
3. `sglang.srt.models.qwen3_5` (imported by the Qwen-VL processor) looks up
   `torch.ops.sgl_kernel.*_cpu` ops at import; register those op names first,
   or the processor silently fails to register. The Gated DeltaNet backend
   modules look up (and later call) two more ops at import.
4. `sglang.kernels.ops.attention.fla.layernorm_gated` (Gated DeltaNet's output norm)
   takes its CPU kernel only on Intel AMX machines and Triton (CUDA) elsewhere; once
   imported, it is pointed at the `fused_rmsnorm_gated_cpu` stand-in on every CPU.
5. `sglang.srt.models.qwen2_moe` (Qwen3.5-MoE's sparse block) gates its shared expert with
   Triton kernels where there is no AMX: pure-torch ones (`runtime/elementwise.py`) replace them.
6. `sglang.srt.layers.attention.vision`: the CPU vision backend builds a dense mask over every
   patch of a video; it attends frame by frame instead (`runtime/vision_attention.py`).
7. Speculative decoding (NEXTN / EAGLE chains): the torch-native attention backend gains target
   verify and `DraftBackendFactory` a torch-native draft backend (`runtime/speculative_attention.py`);
   the Mamba-state commit after verify, CUDA/XPU-only upstream, gets pure-torch scatters
   (`runtime/speculative_kernels.py`).
8. `sglang.srt.layers.attention.mamba.mamba` (Mamba2, NemotronH / Nemotron-Nano-VL) imports its causal
   convolution only on CUDA/NPU/XPU and scans with Triton: pure-torch stand-ins (`runtime/mamba2.py`)
   are bound into it under the names its `MambaMixer2.forward` calls.
9. Qwen4-Exp's sparse-attention indexer (QSA): `qsa.qsa_indexer.QSAIndexer` gains `forward_cpu` and
   `forward_native` (its portable `_forward_impl`; SGLang takes `forward_cpu` only on AMX CPUs), and
   `qsa.kernel` / `qsa.metadata` a pure-torch `gather_qsa_compressed_keys` for the Triton kernel (`runtime/qsa.py`).
10. `sglang.srt.entrypoints.engine` starts its scheduler and detokenizer processes by `spawn` (a CUDA
    process cannot fork): each imported SGLang again, about 4 s of the 2-core machine's 15 s server start.
    With no CUDA to protect they are forked from the launching process, which has imported it already;
    each still loads SGLang's plugins itself, as a spawned one does. uvicorn spawns the HTTP tokenizer workers
    of `--tokenizer-worker-num` > 1 the same way (`uvicorn._subprocess.spawn`): forked too.
11. Prefill/decode disaggregation (`runtime/disaggregation.py`): the host KV pool a decode server builds at
    startup (also `--enable-hierarchical-cache`'s) pins its buffers with `cudaHostRegister`: over a CPU device
    pool it allocates them unpinned; the prefill server's KV sender records `torch.cuda` events and pins page
    indices: the CPU device module's no-op events stand in, and nothing is pinned; the pool's reserve of
    free memory is 1 GiB, not a GPU host's 10.
12. `--enable-hierarchical-cache` (`runtime/hierarchical_cache.py`): the MHA host pool's copies between the
    device and host KV pools are `sgl_kernel.kvcacheio` ops it imports only on CUDA, ROCm and XPU: torch
    bodies are bound into `sglang.srt.mem_cache.pool_host.mha` under the names it calls.
13. LoRA (`runtime/lora.py`): SGLang's LoRA layers and torch-native LoRA backend pin small host tensors, which
    raises on a CPU-only torch: in those modules nothing is created pinned, and a server that builds a
    `LoRAManager` gets a `Tensor.pin_memory` that returns the tensor itself.
"""

import ctypes
import importlib.abc
import importlib.machinery
import importlib.util
import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from sglang_evs.runtime import graph_mode

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


def _deferred(target: str) -> Callable[[ModuleType], None]:
    """The fix `"runtime_module:function"` (a module of `sglang_evs.runtime`), imported only when its SGLang
    module is: this module runs at every interpreter's start and must stay light."""

    def apply(module: ModuleType) -> None:
        path, name = target.split(":")
        getattr(importlib.import_module(f"sglang_evs.runtime.{path}"), name)(module)

    return apply


def _gated_norm_on_cpu(module: ModuleType) -> None:
    from sglang_evs.runtime.torch_ops import define_sgl_kernel_ops

    define_sgl_kernel_ops()
    module._use_cpu = True  # read at call time by its RMSNorm.forward


def _shared_expert_gate_on_cpu(module: ModuleType) -> None:
    from sglang_evs.runtime import elementwise

    module.fused_gate_sigmoid_mul = elementwise.fused_gate_sigmoid_mul
    module.fused_gate_sigmoid_mul_add = elementwise.fused_gate_sigmoid_mul_add


def _mamba_state_commit_on_cpu(module: ModuleType) -> None:
    from sglang_evs.runtime.speculative_kernels import fused_mamba_state_scatter_with_mask

    module.fused_mamba_state_scatter_with_mask = fused_mamba_state_scatter_with_mask
    module.fused_conv_window_scatter_with_mask = fused_mamba_state_scatter_with_mask
    module._conv_multi_eligible = lambda pairs: False  # its single-launch path is Triton-only


def _fork_server_processes(module: ModuleType) -> None:
    set_envs_and_config = module._set_envs_and_config

    def then_fork(*args, **kwargs):
        result = set_envs_and_config(*args, **kwargs)
        multiprocessing.set_start_method("fork", force=True)
        os.register_at_fork(after_in_child=_load_plugins_again)
        return result

    module._set_envs_and_config = then_fork


def _fork_tokenizer_workers(module: ModuleType) -> None:
    """uvicorn starts the tokenizer workers of `--tokenizer-worker-num` > 1 by `spawn`: fork them too."""
    module.spawn = multiprocessing.get_context("fork")


def _load_plugins_again() -> None:
    """A forked server process loads SGLang's plugins as a spawned one does (SGLang calls `load_plugins`
    early in each process; its flag, copied from the parent, would make that a no-op)."""
    plugins = sys.modules.get("sglang.srt.plugins")
    if plugins is not None:
        plugins._plugins_loaded = False


# module name -> work to do on the module right after it was imported
SGLANG_CPU_AFTER_IMPORT: dict[str, Callable[[ModuleType], None]] = {
    "sglang.srt.layers.attention.vision": _deferred("vision_attention:patch_vision_sdpa"),
    "sglang.kernels.ops.attention.fla.layernorm_gated": _gated_norm_on_cpu,
    "sglang.srt.models.qwen2_moe": _shared_expert_gate_on_cpu,
    "sglang.srt.layers.attention.torch_native_backend": _deferred("speculative_attention:add_target_verify"),
    "sglang.srt.speculative.draft_utils": _deferred("speculative_attention:add_torch_native_draft_backends"),
    "sglang.kernels.ops.mamba.mamba_state_scatter_triton": _mamba_state_commit_on_cpu,
    "sglang.srt.layers.attention.mamba.mamba": _deferred("mamba2:install"),
    # `metadata` imports the gather from `kernel` by name: each is patched when it is imported
    "sglang.srt.layers.attention.qsa.kernel": _deferred("qsa:install_gather"),
    "sglang.srt.layers.attention.qsa.metadata": _deferred("qsa:install_gather"),
    "sglang.srt.layers.attention.qsa.qsa_indexer": _deferred("qsa:install_indexer"),
    "sglang.srt.entrypoints.engine": _fork_server_processes,
    "uvicorn._subprocess": _fork_tokenizer_workers,
    "sglang.srt.mem_cache.pool_host.common": _deferred("disaggregation:host_pool_unpinned"),
    "sglang.srt.mem_cache.pool_host.base": _deferred("disaggregation:host_memory_reserve_on_cpu"),
    "sglang.srt.disaggregation.prefill": _deferred("disaggregation:prefill_sender_on_cpu"),
    "sglang.srt.mem_cache.pool_host.mha": _deferred("hierarchical_cache:install"),
    "sglang.srt.lora.layers": _deferred("lora:lora_modules_unpinned"),
    "sglang.srt.lora.backend.torch_backend": _deferred("lora:lora_modules_unpinned"),
    "sglang.srt.lora.lora_manager": _deferred("lora:pin_memory_is_a_no_op"),
}


def _then(first: Callable[[ModuleType], None] | None, second: Callable[[ModuleType], None]):
    if first is None:
        return second
    return lambda module: (first(module), second(module))


class _ThenLoader(importlib.abc.Loader):
    """The real loader, then a fix applied to the module it executed."""

    def __init__(self, loader: importlib.abc.Loader, finish: Callable[[ModuleType], None]) -> None:
        self.loader, self.finish = loader, finish

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.finish(module)


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
        self._after_import = dict(SGLANG_CPU_AFTER_IMPORT) if sglang_fixes else {}
        if sglang_fixes:
            self._before_import.update(SGLANG_CPU_BEFORE_IMPORT)
        if sglang_fixes and graph_mode.wanted():
            for name, finish in graph_mode.AFTER_IMPORT.items():
                self._after_import[name] = _then(self._after_import.get(name), finish)

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
        finish = self._after_import.pop(fullname, None)
        if finish is not None:
            return spec_then(self, fullname, path, target, finish)
        return None  # let the regular finders import the real module


def sgl_kernel_installed() -> bool:
    """Whether a real `sgl_kernel` that can load here is installed (then neither route stands in for it). A CUDA
    build on a machine without the CUDA driver (SGLang's own GPU requirements, run on a CPU) cannot."""
    try:
        spec = importlib.util.find_spec("sgl_kernel")
    except (ImportError, ValueError):
        return False
    return spec is not None and not (_cuda_build(spec) and not _cuda_driver())


def _cuda_build(spec: importlib.machinery.ModuleSpec) -> bool:
    """Whether the `sgl_kernel` found is a CUDA build: its ops kept per GPU architecture (`sm90/common_ops...`), as
    its own loader looks for them, none at the package's top (where a CPU build keeps them)."""
    origin = getattr(spec, "origin", None)
    folder = Path(origin).parent if origin else None
    return folder is not None and not any(folder.glob("common_ops*")) and any(folder.glob("sm*/common_ops*"))


def _cuda_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def spec_then(
    asker: importlib.abc.MetaPathFinder,
    fullname: str,
    path: Sequence[str] | None,
    target: ModuleType | None,
    finish: Callable[[ModuleType], None],
) -> importlib.machinery.ModuleSpec | None:
    """The spec the other finders (all but `asker`) give `fullname`, its loader running `finish` on the module
    once it executed; None where no finder has it."""
    for finder in sys.meta_path:
        found = None if finder is asker else getattr(finder, "find_spec", None)
        spec = found(fullname, path, target) if found is not None else None
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, finish)
            return spec
    return None
