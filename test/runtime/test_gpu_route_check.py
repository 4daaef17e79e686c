"""The GPU route's import check: SGLang's Qwen3-VL CUDA server path imports through the route's `sgl_kernel` with
`is_cuda()` true, on this CPU machine, and SGLang's platform helpers are themselves again afterwards."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_evs.runtime import gpu_route, gpu_route_check

ROOT = Path(__file__).resolve().parents[2]


def test_cuda_at_import_answers_as_an_sm90_device_and_restores_sglang_helpers():
    import sglang.srt.utils as utils
    import sglang.srt.utils.common as common
    import torch

    before = (common.is_cuda, utils.is_cuda, common.is_sm90_supported, torch.cuda.get_device_capability)
    available = torch.cuda.is_available()
    with gpu_route_check.cuda_at_import(sm=90):
        assert common.is_cuda() and utils.is_cuda() and common.is_cuda_alike()
        assert common.is_sm90_supported() and common.is_hopper_with_cuda_12_3() and not common.is_sm100_supported()
        assert torch.cuda.get_device_capability() == (9, 0) and common.get_device_sm() == 90
        assert torch.cuda.is_available() == available  # torch's own answer is left alone
    assert (common.is_cuda, utils.is_cuda, common.is_sm90_supported, torch.cuda.get_device_capability) == before
    assert common.is_cuda() == (torch.cuda.is_available() and torch.version.cuda is not None)


@pytest.mark.slow
def test_the_cuda_server_path_imports_with_every_sgl_kernel_name_resolved():
    """`python -m sglang_evs.runtime.gpu_route_check`: SGLang's Qwen3-VL CUDA server modules import with
    `is_cuda()` true through the route's `sgl_kernel` (about 40 s: SGLang imports some 5,000 modules)."""
    out = subprocess.run(
        [sys.executable, "-m", "sglang_evs.runtime.gpu_route_check"],
        env={**os.environ, "PYTHONPATH": str(ROOT / "python")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert (
        f"imported {len(gpu_route_check.SERVER_MODULES)} of {len(gpu_route_check.SERVER_MODULES)} modules" in lines[0]
    )
    statuses = dict(line.split("  <- ")[0].split(": ", 1) for line in lines if line.startswith("sgl_kernel"))
    for name in ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul", "top_k_renorm_prob", "weak_ref_tensor"):
        assert statuses[f"sgl_kernel.{name}"] == "torch", name
    assert statuses["sgl_kernel.utils.is_arch_support_pdl"] == "torch"
    assert statuses["sgl_kernel.moe_sum"] == "import-only"
    assert statuses["sgl_kernel.scalar_type"].startswith("absent, expected")
    assert "ABSENT" not in statuses.values()
    assert all(f"{name}: fixed after import" in lines for name in gpu_route.AFTER_IMPORT)
    lazy = [line for line in lines if line.startswith("lazy import ")]
    assert lazy and not any("UNRESOLVED" in line for line in lazy)
    assert any(line.startswith("lazy import sglang.kernels.ops.gemm.cutedsl_dual_gemm: not reached") for line in lazy)


def test_a_function_level_import_of_the_model_path_that_does_not_resolve_fails_unless_known_unreached(
    tmp_path, monkeypatch
):
    """The class of fault the first serve on an H200 met (a model constructor importing a package the route
    lacks), found on CPU: each import inside a function of the model path is tried, and one that fails is
    named with why no server on the route reaches it, or left unexplained (the check then fails)."""
    source = tmp_path / "fake_model_layer.py"
    source.write_text(
        "import os\n"
        "def build():\n    import json\n    from evs_absent_kernels.gemm import fused\n"
        "def on_amd():\n    import aiter\n"
    )
    spec = importlib.util.spec_from_file_location("fake_model_layer", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "fake_model_layer", module)
    monkeypatch.setattr(gpu_route_check, "MODEL_PATH", re.compile(r"fake_model_layer$"))
    assert gpu_route_check.lazy_imports(module) == {"json": 3, "evs_absent_kernels.gemm": 4, "aiter": 6}
    assert gpu_route_check.unresolved_lazy_imports() == [
        ("fake_model_layer:4", "evs_absent_kernels.gemm", ""),
        ("fake_model_layer:6", "aiter", gpu_route_check.UNREACHED_BY_PACKAGE["aiter"]),
    ]
