# Environment for SGLang on a CUDA machine without sglang-kernel or flashinfer (source it). See docs/gpu-route.md.
# Needs the `sglang-evs-gpu-route` distribution (scripts/gpu_route/setup.py) installed: its .pth starts the route.
# Server flags: `python -m sglang_evs.runtime.gpu_route --print-server-args` (sglang_evs.runtime.gpu_route.SERVER_ARGS).
unset SGLANG_USE_CPU_ENGINE                  # the CUDA code paths; the CPU route would refuse the GPU route
export SGLANG_EVS_GPU_ROUTE=1                # serve sgl_kernel from pure torch (only where no real one is installed)
export SGLANG_FORCE_FUSED_OP_BACKEND=torch   # SGLang's fused ops run forward_native (also set by the route itself)
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1  # no sglang-kernel distribution to check (also set by the route)
export HF_HUB_OFFLINE=1                      # nothing is downloaded at run time
export TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
