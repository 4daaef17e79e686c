"""Runtime support for the two routes that serve without SGLang's usual CUDA stack.

- The CPU route: SGLang 0.5.23 on a machine without a GPU. `bootstrap` runs from a `.pth` file in every
  Python process (the `sglang-evs-cpu-route` distribution, `scripts/cpu_route/setup.py`) and installs the
  lazy import hook in `import_fixes`. Its SGLang fixes fire only when `SGLANG_USE_CPU_ENGINE=1` and no real
  `sgl_kernel` is installed, the torchvision one only when torchvision's own ops failed to load.
- The GPU route: SGLang 0.5.23 on CUDA without `sglang-kernel` and flashinfer (`gpu_route`, its pure-torch
  `sgl_kernel` in `sgl_kernel_torch`). The same `bootstrap`, from the `.pth` of `sglang-evs-gpu-route`
  (`scripts/gpu_route/setup.py`), installs it when `SGLANG_EVS_GPU_ROUTE=1` and no real `sgl_kernel` exists.

A regular GPU install has neither `.pth`, and none of this runs there.
"""
