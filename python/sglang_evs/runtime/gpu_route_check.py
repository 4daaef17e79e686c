"""The GPU route's import check: `python -m sglang_evs.runtime.gpu_route_check`, on any machine.

With the route's hook installed (`gpu_route`) and SGLang's platform helpers answering as a CUDA device while
they import (`cuda_at_import`), it imports every module of the Qwen3-VL CUDA server path (`SERVER_MODULES`)
and prints each `sgl_kernel` and flashinfer name SGLang asked for, which module asked, and how it resolved; then
each import the model path makes inside a function (at model construction or in a forward) that does not resolve,
and why no server on the route reaches it (`UNREACHED_BY_PACKAGE`, `UNREACHED_BY_ASKER`): any other fails the check.
Nothing runs on a device: this proves the imports, not the kernels.
"""

import ast
import contextlib
import functools
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

from sglang_evs.runtime.gpu_route import AFTER_IMPORT, APPLIED, ASKED, install

# Modules a Qwen3-VL server (and the plugin in it) imports on CUDA with SERVER_ARGS: the launcher, the scheduler
# and its model runner, the memory pools and radix cache, the layers, the attention backends, the vision tower,
# the multimodal processor, the sampler and logits processor, the graph runners (decode and breakable prefill).
SERVER_MODULES: tuple[str, ...] = (
    "sglang.launch_server",
    "sglang.srt.entrypoints.engine",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.mm_utils",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.model_executor.cuda_graph_buffer_registry",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner",
    "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor",
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.memory_pool_host",
    "sglang.srt.mem_cache.allocation",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.layers.layernorm",
    "sglang.srt.layers.activation",
    "sglang.srt.layers.linear",
    "sglang.srt.layers.dual_gemm",
    "sglang.srt.layers.vocab_parallel_embedding",
    "sglang.srt.layers.rotary_embedding",
    "sglang.srt.layers.radix_attention",
    "sglang.srt.layers.logits_processor",
    "sglang.srt.layers.sampler",
    "sglang.srt.layers.attention.attention_registry",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.attention.vision",
    "sglang.srt.distributed.device_communicators.custom_all_reduce",
    "sglang.srt.constrained.xgrammar_backend",
    "sglang.srt.models.qwen3",
    "sglang.srt.models.qwen3_vl",
    "sglang.srt.multimodal.processors.qwen_vl",
    "sglang.srt.multimodal.evs",
    "sglang.srt.multimodal.vit_cuda_graph_runner",
    "sglang.srt.managers.multimodal_processor",
    # the plugin, loaded by SGLang in each of those processes
    "sglang_evs.plugin",
    "sglang_evs.models.qwen3_vl",
    "sglang_evs.pruning.processor",
)

# Looked up by SGLang on CUDA, absent here on purpose: where SGLang catches the ImportError itself.
EXPECTED_ABSENT: dict[str, str] = {
    "sgl_kernel.scalar_type": "layers/quantization/utils.py catches the ImportError and uses mock scalar types",
    "sgl_kernel.allreduce": "custom_all_reduce_ops.py catches it; custom all-reduce is off (SERVER_ARGS) and tp is 1",
    "sgl_kernel.kvcacheio.transfer_embedding_ranges_direct": "embedding_cache_controller.py (encoder disaggregation) "
    "catches the ImportError",
}


# The modules that build and run the Qwen3-VL model on this path (matched against every module the check imported).
# Their function-level imports run at model construction or in a forward, which importing them does not reach:
# the first serve on an H200 failed on one (`DualGemm`'s probe of a CuTe DSL kernel, which needs `cutlass`).
MODEL_PATH = re.compile(
    r"sglang\.srt\.(models\.(qwen2|qwen3|qwen3_vl)$|layers\.(?!moe|quantization|attention\.(?!triton_backend$|vision$"
    r"|attention_registry$))|model_executor\.|distributed\.parallel_state$|mem_cache\.(memory_pool|radix_cache|"
    r"allocation)$|managers\.(mm_utils|schedule_batch|scheduler)$)"
)
# Function-level imports of the model path that do not resolve on this route, and why no Qwen3-VL server on the
# route runs them: by the package the import lacks, else by the module that asks.
UNREACHED_BY_PACKAGE: dict[str, str] = {
    "aiter": "AMD ROCm kernels", "torch_npu": "Ascend NPUs", "sgl_kernel_npu": "Ascend NPUs", "mlx": "Apple MLX",
    "mindspore": "the MindSpore runner", "flash_attn_interface": "Moore Threads (MUSA) attention",
    "flashinfer": "absent by design: SERVER_ARGS choose backends without it", "flash_mla": "MLA models' attention",
    "deep_gemm": "FP8 models' DeepGEMM", "ray": "Ray launches", "vllm": "vLLM interoperation",
    "msprobe": "Ascend's precision debugger", "xielu": "the xIELU activation (Apertus)",
    "mooncake": "Mooncake transfers (disaggregation, remote weight loading; not carried to the GPU machine)",
}  # fmt: skip
UNREACHED_BY_ASKER: dict[str, str] = {
    "sglang.srt.layers.dual_gemm": "DualGemm's mode probe, answered by the route (AFTER_IMPORT) before it imports",
    "sglang.srt.layers.attention.attention_registry": "attention backends SERVER_ARGS do not choose (FlashAttention, "
    "MiniCPM, XPU: sgl_kernel's kernels)",
    "sglang.srt.layers.attention.triton_backend": "the dLLM FlashAttention-4 path (--dllm-algorithm only)",
    "sglang.srt.model_executor.model_runner": "MoE DWDP (--dwdp-size > 1 only)",
    "sglang.srt.model_executor.model_runner_components.weight_updater": "checkpoint-engine weight updates",
    "sglang.srt.distributed.parallel_state": "Mooncake process groups (elastic expert parallelism)",
}


def lazy_imports(module: ModuleType) -> dict[str, int]:
    """The absolute module names `module` imports inside its functions -> the first line that does."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.ImportFrom) and inner.module:
                name = importlib.util.resolve_name("." * inner.level + inner.module, module.__package__)
                found.setdefault(name, inner.lineno)
            elif isinstance(inner, ast.Import):
                for alias in inner.names:
                    found.setdefault(alias.name, inner.lineno)
    return found


def unresolved_lazy_imports() -> list[tuple[str, str, str]]:
    """(asker:line, imported module, why it is not reached, or "") for each function-level import of the model
    path's modules (`MODEL_PATH`, among those imported) that fails to import here as on CUDA."""
    askers = sorted(
        name for name in sys.modules if MODEL_PATH.match(name) and getattr(sys.modules[name], "__file__", None)
    )
    unresolved = []
    with cuda_at_import():
        for asker in askers:
            for name, line in lazy_imports(sys.modules[asker]).items():
                try:
                    importlib.import_module(name)
                except Exception as error:  # noqa: BLE001 - each one is classified, not raised
                    package = (getattr(error, "name", None) or "").split(".")[0]
                    why = UNREACHED_BY_PACKAGE.get(package) or UNREACHED_BY_ASKER.get(asker, "")
                    unresolved.append((f"{asker}:{line}", name, why))
    return unresolved


@contextlib.contextmanager
def cuda_at_import(sm: int = 90) -> Iterator[None]:
    """SGLang's platform helpers answer as on an sm `sm` CUDA device while the block runs, then are restored.

    SGLang decides `_is_cuda = is_cuda()` (torch.cuda.is_available() and torch.version.cuda) once per module at
    import, through the cached helpers of `sglang.srt.utils.common` (re-exported by `sglang.srt.utils`, which
    modules import from both): those are replaced, not torch's availability. The architecture probes
    (`is_sm90_supported`, ... : cached partials that read torch.version.cuda) answer for `sm`, and
    `torch.cuda.get_device_capability`, which one Triton module (`kernels/ops/attention/prefill_attention.py`)
    calls at import, answers (sm // 10, sm % 10). Nothing runs on a device.
    """
    import sglang.srt.utils as utils
    import sglang.srt.utils.common as common
    import torch

    answers: dict[str, Callable] = {
        "is_cuda": lambda: True,
        "is_cuda_alike": lambda: True,
        "get_device_sm": lambda: sm,
        "get_device_capability": lambda device_id=0: (sm // 10, sm % 10),
        "get_cuda_version": lambda: (13, 0),
    }
    for name, value in vars(common).items():
        inner = getattr(value, "__wrapped__", None)
        if isinstance(inner, functools.partial) and inner.func is common._check_cuda_device_version:
            majors = inner.keywords["device_capability_majors"]
            answers[name] = functools.partial(bool, sm // 10 in majors)
    saved = [(module, name, getattr(module, name)) for module in (common, utils) for name in answers]
    saved.append((torch.cuda, "get_device_capability", torch.cuda.get_device_capability))
    try:
        for module, name, _ in saved[:-1]:
            setattr(module, name, functools.lru_cache(maxsize=1)(answers[name]))
        torch.cuda.get_device_capability = lambda device=None: (sm // 10, sm % 10)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _status(name: str) -> str:
    from sglang_evs.runtime.sgl_kernel_torch import IMPORT_ONLY, MODULES, PROVIDED

    module, _, attr = name.rpartition(".")
    if name.startswith("flashinfer"):
        return "absent (flashinfer is not installed on this route)"
    if name in MODULES:
        return "module"
    if attr in PROVIDED.get(module, {}):
        return "torch"
    if attr in IMPORT_ONLY.get(module, ()):
        return "import-only"
    if name in EXPECTED_ABSENT:
        return f"absent, expected: {EXPECTED_ABSENT[name]}"
    return "ABSENT"


def _without_cpu_route_fixes() -> None:
    """On a CPU-route machine the bootstrap's finder keeps only its torchvision fix (PyPI's torchvision needs it
    there); none of its SGLang fixes may act while the CUDA path imports."""
    from sglang_evs.runtime.import_fixes import CpuImportFixes

    sys.meta_path[:] = [
        CpuImportFixes(sglang_fixes=False) if isinstance(finder, CpuImportFixes) else finder for finder in sys.meta_path
    ]


def check(modules: Sequence[str] = SERVER_MODULES) -> int:
    """Import `modules` as a CUDA server would on this route; print what was asked of sgl_kernel and
    flashinfer and how each resolved. 0 when every module imported and every name resolved as expected."""
    if "sglang" in sys.modules:
        print("run the check in a fresh interpreter: SGLang is imported already", file=sys.stderr)
        return 2
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)
    _without_cpu_route_fixes()
    install()
    failed: list[str] = []
    with cuda_at_import():
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as error:  # every failure is reported, not only the first
                failed.append(f"{name}: {type(error).__name__}: {error}")
    imported = len(modules) - len(failed)
    print(f"imported {imported} of {len(modules)} modules of the CUDA server path with is_cuda() true")
    bad = list(failed)
    for name in AFTER_IMPORT:
        print(f"{name}: {'fixed after import' if name in APPLIED else 'NOT FIXED'}")
        if name not in APPLIED:
            bad.append(f"the after-import fix of {name} did not run")
    for name in sorted(ASKED):
        status = _status(name)
        askers = ", ".join(sorted(ASKED[name]))
        print(f"{name}: {status}  <- {askers}")
        if status == "ABSENT":
            bad.append(f"{name} asked by {askers} and not provided")
    for asker, name, why in unresolved_lazy_imports():
        print(f"lazy import {name}: {'not reached: ' + why if why else 'UNRESOLVED'}  <- {asker}")
        if not why:
            bad.append(f"{name}, imported inside a function of {asker}, does not resolve on this route")
    for line in bad:
        print(f"FAILED {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(check())
