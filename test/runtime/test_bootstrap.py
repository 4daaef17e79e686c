"""The CPU import fixes switch on only where they are needed: in fresh interpreters, and on the CPU route."""

import os
import subprocess
import sys
import textwrap

from sglang_evs.testing.server import COLD_START_ENV, CPU_ENV


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in CPU_ENV}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**base, **env},
    )


def test_without_cpu_engine_sgl_kernel_stays_absent():
    done = run_python(
        """
        import importlib.util
        assert importlib.util.find_spec("sgl_kernel") is None
        try:
            import sgl_kernel
        except ModuleNotFoundError:
            print("absent")
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "absent", done.stderr


def test_with_cpu_engine_sglang_imports_and_stand_in_is_strict(cpu_route):
    """In an interpreter that started on the CPU route and imported SGLang (a snippet forked from the warm
    interpreter: the route's fixes acted as that interpreter imported, as in any server)."""
    out = cpu_route(
        """
        import sgl_kernel
        from sgl_kernel import assign_req_to_token_pool_cpu, copy_all_layer_kv_cache_cpu
        try:
            from sgl_kernel import some_kernel_that_does_not_exist
        except ImportError:
            print("unknown name -> ImportError")
        from sglang.srt.managers.multimodal_processor import PROCESSOR_MAPPING, import_processors
        import_processors("sglang.srt.multimodal.processors")  # qwen_vl imports models/qwen3_5.py
        import torch
        assert hasattr(torch.ops.sgl_kernel, "fused_sigmoid_mul_cpu")
        assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")  # would switch on AMX paths
        print(sorted(cls.__name__ for cls in PROCESSOR_MAPPING if "Qwen3VL" in cls.__name__))
        """
    )
    assert "unknown name -> ImportError" in out
    assert "Qwen3VLForConditionalGeneration" in out


def test_torchvision_imports_and_resizes():
    """PyPI's torchvision is a CUDA build; SGLang only needs its resize on CPU."""
    done = run_python(
        """
        import torch, torchvision
        from torchvision.transforms.functional import resize
        assert resize(torch.zeros(3, 8, 8), [4, 4]).shape == (3, 4, 4)
        boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]], dtype=torch.float32)
        print(torch.ops.torchvision.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist())
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[0, 2]"


def test_opt_out_switch_disables_everything():
    done = run_python(
        """
        import sys
        print([type(f).__name__ for f in sys.meta_path])
        """,
        SGLANG_USE_CPU_ENGINE="1",
        SGLANG_EVS_DISABLE_CPU_RUNTIME="1",
    )
    assert done.returncode == 0 and done.stdout.startswith("["), done.stderr[-3000:]  # the probe ran
    assert "CpuImportFixes" not in done.stdout


def test_a_cpu_server_forks_its_scheduler_and_detokenizer(tiny_server):
    """SGLang starts them by `spawn`, and each imports SGLang's model registry again, which logs the models
    it cannot import (here: grok, whose kernel the CPU stand-in lacks) once per importing process. On the
    CPU route they are forked from the launcher, which imported it already: the line appears once in a fresh
    server, and never in one forked from a warm interpreter (which imported the registry before the fork)."""
    line = "Ignore import error when loading sglang.srt.models.grok"
    imported_before_the_fork = os.environ.get(COLD_START_ENV) != "1"
    assert tiny_server.log().count(line) == (0 if imported_before_the_fork else 1), tiny_server.log()[-3000:]


def fake_sgl_kernel(root, ops: str):
    """An `sgl_kernel` package under `root` with its ops file at `ops` (a CUDA build's `sm100/common_ops...`, a CPU
    build's `common_ops...`)."""
    package = root / "sgl_kernel"
    (package / ops).parent.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / ops).write_text("")


def test_a_cuda_build_of_sgl_kernel_without_the_cuda_driver_is_stood_in_for_and_a_cpu_build_is_not(
    tmp_path, monkeypatch
):
    """SGLang's own requirements bring sglang-kernel's CUDA build: on a machine without the CUDA driver it cannot
    load, so the CPU route stands in for it as where it is absent; with the driver, or as a CPU build, it is real."""
    from sglang_evs.runtime import import_fixes

    cuda, cpu = tmp_path / "cuda", tmp_path / "cpu"
    fake_sgl_kernel(cuda, "sm100/common_ops.abi3.so")
    fake_sgl_kernel(cpu, "common_ops.abi3.so")
    finders = [finder for finder in sys.meta_path if not isinstance(finder, import_fixes.CpuImportFixes)]
    for root, driver, real in ((cuda, False, False), (cuda, True, True), (cpu, False, True)):
        monkeypatch.setattr(sys, "meta_path", finders)  # as at interpreter start, before the route's own finder
        monkeypatch.setattr(sys, "path", [str(root), *sys.path])
        monkeypatch.setattr(import_fixes, "_cuda_driver", lambda driver=driver: driver)
        sys.modules.pop("sgl_kernel", None)
        assert import_fixes.sgl_kernel_installed() is real, (root.name, driver)
        monkeypatch.undo()
