"""Run at interpreter start (from `sglang_evs_cpu_runtime.pth` or `sglang_evs_gpu_route.pth`); must stay cheap.

SGLang imports `sgl_kernel` and touches `torch.ops.sgl_kernel.*` at module
import time, in the scheduler subprocess before `load_plugins()` runs there,
so the plugin entry point is too late for these fixes: only an import hook
installed at interpreter start reaches every process.

Two routes share this file: the CPU route (`SGLANG_USE_CPU_ENGINE=1`, `import_fixes`) and the GPU route
without sglang-kernel (`SGLANG_EVS_GPU_ROUTE=1`, `gpu_route`). Neither acts where a real `sgl_kernel` is
installed.
"""

import os
import sys


def sglang_cpu_fixes_wanted() -> bool:
    from sglang_evs.runtime.import_fixes import sgl_kernel_installed

    return os.environ.get("SGLANG_USE_CPU_ENGINE") == "1" and not sgl_kernel_installed()


def install() -> None:
    if os.environ.get("SGLANG_EVS_GPU_ROUTE") == "1":
        from sglang_evs.runtime import gpu_route

        if gpu_route.wanted():
            gpu_route.install()
    if os.environ.get("SGLANG_EVS_DISABLE_CPU_RUNTIME") == "1":
        return
    from sglang_evs.runtime.import_fixes import CpuImportFixes

    if not any(isinstance(f, CpuImportFixes) for f in sys.meta_path):
        sys.meta_path.insert(0, CpuImportFixes(sglang_fixes=sglang_cpu_fixes_wanted()))


install()
