"""The GPU route (no sglang-kernel, no flashinfer): when it activates, what its `sgl_kernel` serves, that SGLang's
CUDA server path imports through it, and the server flags it serves with."""

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from sglang_evs.runtime import gpu_route

ROOT = Path(__file__).resolve().parents[2]
ROUTE_ACTIVE = any(isinstance(finder, gpu_route.GpuImportFixes) for finder in sys.meta_path)


def route_env(**changes: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def test_wanted_only_when_asked_off_the_cpu_engine_and_without_a_real_sgl_kernel(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    monkeypatch.delenv(gpu_route.ROUTE_ENV, raising=False)
    assert not gpu_route.wanted()
    monkeypatch.setenv(gpu_route.ROUTE_ENV, "1")
    assert gpu_route.wanted()
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    assert not gpu_route.wanted()
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: object())  # sglang-kernel installed
    assert not gpu_route.wanted()


def serve(name: str) -> ModuleType:
    """The module the route's finder serves for `name` (without putting the finder on sys.meta_path)."""
    spec = gpu_route.GpuImportFixes().find_spec(name, None)
    assert spec is not None, name
    return importlib.util.module_from_spec(spec)


def test_the_finder_serves_the_stand_in_package_and_nothing_else():
    from sglang_evs.runtime import sgl_kernel_torch as ops

    top = serve("sgl_kernel")
    assert top.rmsnorm is ops.rmsnorm and top.weak_ref_tensor is ops.weak_ref_tensor and top.__path__ == []
    assert serve("sgl_kernel.utils").is_arch_support_pdl() is False
    with pytest.raises(NotImplementedError, match="sgl_kernel.kvcacheio.transfer_kv_direct"):
        serve("sgl_kernel.kvcacheio").transfer_kv_direct()
    with pytest.raises(AttributeError, match="flash_attn_varlen_func"):
        top.flash_attn_varlen_func  # noqa: B018  (absent: `from sgl_kernel import x` is an ImportError)
    finder = gpu_route.GpuImportFixes()
    assert finder.find_spec("sgl_kernel.flash_attn", None) is None
    assert finder.find_spec("sgl_kernel.scalar_type", None) is None
    assert finder.find_spec("flashinfer", None) is None
    assert {"sgl_kernel.flash_attn_varlen_func", "sgl_kernel.flash_attn", "flashinfer"} <= set(gpu_route.ASKED)


def test_server_args_parse_as_sglang_reads_them():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "m", *gpu_route.SERVER_ARGS])
    assert (args.device, args.attention_backend, args.mm_attention_backend, args.sampling_backend) == (
        "cuda",
        "triton",
        "triton_attn",
        "pytorch",
    )
    assert args.disable_custom_all_reduce and args.disable_flashinfer_autotune and args.bf16_gemm_backend == "torch"
    assert all(isinstance(arg, str) for arg in gpu_route.SERVER_ARGS)


def test_the_route_environment_lets_the_launcher_start_without_the_sglang_kernel_distribution(monkeypatch):
    """SGLang's launcher asserts `sglang-kernel` >= 0.4.9 on CUDA (`engine._set_envs_and_config`)."""
    from sglang.srt.utils.common import assert_pkg_version

    monkeypatch.delenv("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", raising=False)
    with pytest.raises(Exception, match="sglang-kernel with minimum required version 0.4.9 is not installed"):
        assert_pkg_version("sglang-kernel", "0.4.9", "")
    for name, value in gpu_route.ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    assert_pkg_version("sglang-kernel", "0.4.9", "")


def test_a_fresh_interpreter_with_the_route_on_imports_the_stand_in_as_sgl_kernel():
    """What the `.pth` does in every server process: here the CPU route's `.pth` runs the same bootstrap."""
    probe = (
        "import os, sgl_kernel, sgl_kernel.utils; from sglang_evs.runtime import gpu_route as r; "
        "print(type(sgl_kernel).__name__, sgl_kernel.rmsnorm.__module__, sgl_kernel.utils.is_arch_support_pdl(), "
        "os.environ['SGLANG_FORCE_FUSED_OP_BACKEND'], sorted(r.ASKED))"
    )
    env = route_env(SGLANG_USE_CPU_ENGINE=None, SGLANG_FORCE_FUSED_OP_BACKEND=None, **{gpu_route.ROUTE_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [
        "StandInModule",
        "sglang_evs.runtime.sgl_kernel_torch",
        "False",
        "torch",
        "['sgl_kernel.rmsnorm',",
        "'sgl_kernel.utils',",
        "'sgl_kernel.utils.is_arch_support_pdl']",
    ]
    off = subprocess.run(
        [sys.executable, "-c", "import sgl_kernel"],
        env=route_env(SGLANG_USE_CPU_ENGINE=None, **{gpu_route.ROUTE_ENV: None}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert off.returncode != 0 and "No module named 'sgl_kernel'" in off.stderr  # the route is off by default


def sglang_block(dtype, device):
    """SGLang's own layers a Qwen3-VL decoder layer runs: RMSNorm (with residual), M-RoPE, SiluAndMul."""
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding import get_rope

    norm = RMSNorm(64).to(device, dtype)
    rope_scaling = {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True}
    rope = get_rope(16, rotary_dim=16, max_position=256, base=10000, rope_scaling=rope_scaling, dtype=dtype).to(device)
    act = SiluAndMul()

    def block(x, residual, positions):
        """x, residual [T, 64], positions [3, T] -> (q [T, 64], k [T, 32], mlp [T, 32], residual [T, 64])."""
        h, residual = norm(x, residual)
        q, k = rope(positions, h.clone(), h[:, :32].clone())
        return q, k, act(h), residual

    return block


def test_the_route_forces_sglang_fused_ops_onto_forward_native():
    """`ENVIRONMENT` names a backend SGLang knows, and forcing it labels every fused op of the block as torch."""
    from sglang.kernels import fused_op
    from sglang.kernels.spec import KernelBackend

    forced = KernelBackend(gpu_route.ENVIRONMENT["SGLANG_FORCE_FUSED_OP_BACKEND"])
    assert forced is KernelBackend.TORCH
    block = sglang_block(torch.float32, "cpu")
    x, residual = torch.randn(5, 64), torch.randn(5, 64)
    positions = torch.randint(0, 100, (3, 5))
    previous = fused_op.get_fused_op_backend()
    fused_op.set_fused_op_backend(forced)
    fused_op.clear_fused_op_trace()
    fused_op.enable_fused_op_trace()
    try:
        block(x, residual, positions)
        ran = [(record.op, record.backend) for record in fused_op.get_fused_op_trace()]
    finally:
        fused_op.disable_fused_op_trace()
        fused_op.set_fused_op_backend(previous)
    assert len(ran) == 3 and {backend for _, backend in ran} == {"torch"}, ran


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and ROUTE_ACTIVE),
    reason="needs a CUDA GPU with the GPU route active (SGLANG_EVS_GPU_ROUTE=1, sglang-evs-gpu-route installed)",
)
def test_sglang_layers_on_the_route_capture_and_replay_in_a_cuda_graph():
    """SGLang's own layers, as the route runs them (forward_native, no JIT, no sgl_kernel op), in a real CUDA graph:
    a replay on new inputs equals the eager forward, and every fused op ran its torch path."""
    from sglang.kernels import fused_op

    device, dtype = torch.device("cuda"), torch.bfloat16
    block = sglang_block(dtype, device)
    gen = torch.Generator().manual_seed(0)
    static = [torch.randn(8, 64, generator=gen).to(device, dtype) for _ in range(2)]
    static.append(torch.randint(0, 200, (3, 8), generator=gen).to(device))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        block(static[0], static[1].clone(), static[2])
    torch.cuda.current_stream().wait_stream(stream)
    fused_op.clear_fused_op_trace()
    fused_op.enable_fused_op_trace()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            outputs = block(*static)
        ran = {record.backend for record in fused_op.get_fused_op_trace()}
    finally:
        fused_op.disable_fused_op_trace()
    assert ran == {"torch"}, ran
    for seed in range(1, 4):
        gen = torch.Generator().manual_seed(seed)
        fresh = [torch.randn(8, 64, generator=gen).to(device, dtype) for _ in range(2)]
        fresh.append(torch.randint(0, 200, (3, 8), generator=gen).to(device))
        for slot, value in zip(static, fresh, strict=True):
            slot.copy_(value)
        graph.replay()
        expected = block(*fresh)
        for got, want in zip(outputs, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_dense_mlps_take_sglangs_own_path_without_the_cute_dsl_dual_gemm(monkeypatch):
    """Every dense MLP (Qwen3-VL's language model's) builds a `DualGemm`, whose mode probe on CUDA imports the
    Blackwell-only CuTe DSL kernel and `cutlass`, which the route does not carry: the first serve on an H200 failed
    there. On the route the probe answers "no mode" and imports nothing."""
    import sglang.srt.layers.dual_gemm as dual_gemm

    monkeypatch.setattr(dual_gemm.DualGemm, "_select_mode", dual_gemm.DualGemm._select_mode)  # restored after
    monkeypatch.setattr(dual_gemm, "is_cuda", lambda: True)
    monkeypatch.setitem(sys.modules, "cutlass", None)  # importing it raises, as on the GPU machine
    gemm = object.__new__(dual_gemm.DualGemm)
    with pytest.raises(ImportError):
        gemm._select_mode(object(), 64)
    gpu_route.AFTER_IMPORT["sglang.srt.layers.dual_gemm"](dual_gemm)
    assert gemm._select_mode(object(), 64) is None
