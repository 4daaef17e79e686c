"""A CPU rehearsal of the GPU machine's setup (docs/gpu-route.md): a Python 3.12 venv with torch 2.11.0 (the
PyPI CUDA build, run on CPU), transformers 5.17.0 and the rest of the machine's image at its versions
(scripts/gpu_rehearsal_env.sh) gets exactly the carried wheel set (scripts/gpu_wheels.py), installed as the
machine installs it (scripts/gpu_run.sh's install step: offline, no dependencies); then SGLang 0.5.23 with
sglang-evs imports there and serves the tiny Qwen3-VL a video pruned at q = 0.75 (scripts/gpu_pack/
serve_check.py). The only wheel added beyond the carried set is the CPU route's .pth (sglang-evs-cpu-route),
since this machine has no GPU. Its own tier (`bash scripts/run_tests.sh --rehearsal`), run before a device
call or after a change to the GPU scripts, not in the everyday or CI suites: the first run downloads about
4 GB and builds a 5.5 GB venv under .cache/gpu-rehearsal/ (3 min here), later runs reuse it."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache"

pytestmark = pytest.mark.rehearsal  # its own tier: `bash scripts/run_tests.sh --rehearsal`

REHEARSAL = CACHE / "gpu-rehearsal"
# As scripts/gpu_run.sh sets it: SGLang's bundled Rust radix-tree core (built against torch 2.14.1) panics on
# its first insert under torch 2.11 ("Unsupported TypeMeta in ATen").
NO_PYTHON_3_12 = 3  # scripts/gpu_rehearsal_env.sh's exit status without a Python 3.12 to build on
TORCH_2_11_ENV = {"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python"}
IMAGE_VENV = REHEARSAL / "venv"


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without what points at the checkout or the CPU route: the rehearsal
    imports sglang-evs from its installed wheel, as the GPU machine does."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, **extra}


def run(cmd, timeout: float, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)
    print(f"{' '.join(map(str, cmd))[:120]}: exit {done.returncode} in {time.monotonic() - started:.0f} s")
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> dict:
    """The image venv, the wheel set, and the overlay venv gpu_run.sh installs it into (its install, facts and
    route steps run here, CUDA absent); then the CPU route's .pth in the same overlay venv."""
    image = subprocess.run(["bash", "scripts/gpu_rehearsal_env.sh", str(IMAGE_VENV)], cwd=REPO, capture_output=True,
                           text=True, timeout=2400)  # fmt: skip
    if image.returncode == NO_PYTHON_3_12:
        pytest.skip(f"the rehearsal needs Python 3.12, the GPU machine's: {image.stderr.strip()}")
    assert image.returncode == 0, image.stdout[-4000:] + image.stderr[-4000:]
    wheels = REHEARSAL / "whl"
    packed = run([sys.executable, "scripts/gpu_wheels.py", "--out", str(wheels)], timeout=900, env=clean_environment())
    work, out = REHEARSAL / "work", tmp_path_factory.mktemp("gpu-run-out")
    steps = "install facts route"
    env = clean_environment(PYTHON=str(IMAGE_VENV / "bin" / "python"), OUT=str(out), SGLANG_EVS_GPU_WORK=str(work),
                            WHEELS_DIR=str(wheels), STEPS=steps)  # fmt: skip
    for key in ("SGLANG_USE_CPU_ENGINE",):
        env.pop(key, None)
    gpu_run = subprocess.run(["bash", "scripts/gpu_run.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=900)  # fmt: skip
    venv_python = work / "venv" / "bin" / "python"
    cpu_route = tmp_path_factory.mktemp("cpu-route-wheel")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(cpu_route),
         "scripts/cpu_route"], timeout=300, env=clean_environment(PIP_CONSTRAINT=""))  # fmt: skip
    run([str(venv_python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
         *map(str, cpu_route.glob("*.whl"))], timeout=300, env=clean_environment())  # fmt: skip
    return {"packed": packed.stdout, "gpu_run": gpu_run, "out": out, "python": venv_python, "work": work}


def test_the_wheel_set_fits_one_device_call(rehearsal):
    runs = [line for line in rehearsal["packed"].splitlines() if line.startswith("run")]
    print(rehearsal["packed"])
    assert len(runs) == 1, runs
    assert "sglang-0.5.23-cp312" in rehearsal["packed"]


def test_gpu_run_installs_the_set_offline_and_reports(rehearsal):
    gpu_run = rehearsal["gpu_run"]
    report = (rehearsal["out"] / "report.md").read_text()
    assert gpu_run.returncode == 0, f"{gpu_run.stdout[-4000:]}\n{gpu_run.stderr[-2000:]}"
    assert "result: PASS" in report and "| install | pass |" in report, report
    assert "sglang 0.5.23" in report and "torch 2.11.0" in report and "transformers 5.17.0" in report, report
    assert (rehearsal["out"] / "logs.tar.gz").is_file()


def test_sglang_imports_from_the_installed_wheels(rehearsal):
    """Every module SGLang's server and the plugin import come from the overlay venv or the image, none from
    the checkout; the GPU route's import check runs where the module exists (its own branch adds it)."""
    code = (
        "import sglang, sglang_evs, torch, transformers, decord, sglang.srt.utils.video_decoder as v; "
        "print(sglang.__file__, sglang_evs.__file__, torch.__version__, transformers.__version__, v._BACKEND)"
    )
    env = clean_environment(SGLANG_USE_CPU_ENGINE="1")
    done = run([str(rehearsal["python"]), "-c", code], timeout=300, env=env)
    sglang_file, evs_file, torch_version, transformers_version, backend = done.stdout.split()[-5:]
    venv = str(rehearsal["work"] / "venv")
    assert sglang_file.startswith(venv) and evs_file.startswith(venv), done.stdout
    assert (torch_version, transformers_version, backend) == ("2.11.0+cu130", "5.17.0", "decord"), done.stdout
    if (REPO / "python" / "sglang_evs" / "runtime" / "gpu_route.py").is_file():
        run([str(rehearsal["python"]), "-m", "sglang_evs.runtime.gpu_route_check"], timeout=300,
            env=clean_environment())  # fmt: skip


def test_the_decord_reader_gives_the_clips_frames(rehearsal, media_dir, tmp_path):
    """The carried decord API over OpenCV decodes the suite's H.264 clip (8 frames at 4 fps) as PyAV does here,
    frame for frame, RGB, in the order asked, through SGLang's own VideoDecoderWrapper too."""
    import av
    import numpy as np

    clip = media_dir / "moving.mp4"
    with av.open(str(clip)) as container:
        np.save(tmp_path / "want.npy", np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]))
    code = f"""
import json, numpy as np, decord
from sglang.srt.utils.video_decoder import VideoDecoderWrapper
want = np.load({str(tmp_path / "want.npy")!r}).astype(int)
reader = decord.VideoReader({str(clip)!r}, ctx=decord.cpu(0))
got = reader.get_batch([7, 0, 3]).asnumpy().astype(int)
wrapped = VideoDecoderWrapper({str(clip)!r}).get_frames_as_tensor([1, 6]).numpy().astype(int)
print(json.dumps({{"len": len(reader), "fps": reader.get_avg_fps(), "shape": list(got.shape),
    "gap": float(np.abs(got - want[[7, 0, 3]]).max()), "wrapped_gap": float(np.abs(wrapped - want[[1, 6]]).max()),
    "neighbour_gap": float(np.abs(got[0] - want[6]).mean())}}))
"""
    env = clean_environment(SGLANG_USE_CPU_ENGINE="1")
    out = json.loads(run([str(rehearsal["python"]), "-c", code], timeout=300, env=env).stdout.splitlines()[-1])
    assert (out["len"], out["fps"], out["shape"]) == (8, 4.0, [3, 64, 64, 3]), out
    assert out["gap"] <= 2 and out["wrapped_gap"] <= 2 and out["neighbour_gap"] > 2, out


def test_the_gpu_checks_collect_and_build_their_inputs_with_the_images_packages(rehearsal):
    """What the graph check runs on the GPU machine, run here in the image's packages (no PyAV: clips written with
    OpenCV; transformers 5.17.0 builds the tiny model): every GPU test module collects (their GPU tests skip
    here) and the CPU-side checks of the GPU test's servers, cases and benchmark pass, fixtures included."""
    env = clean_environment(SGLANG_USE_CPU_ENGINE="1", TORCHDYNAMO_DISABLE="1", HF_HUB_OFFLINE="1",
                            TRANSFORMERS_OFFLINE="1", **TORCH_2_11_ENV)  # fmt: skip
    modules = ["test/runtime/test_sgl_kernel_torch.py", "test/runtime/test_gpu_route.py",
               "test/methods/test_methods_gpu.py", "test/models/test_prefill_cuda_graph_gpu.py",
               "test/models/test_prefill_cuda_graph_gpu_setup.py", "test/test_vit_graph_trace.py",
               "test/bench/test_bench_gpu_ttft.py", "test/bench/test_bench_gpu_ttft_compact.py",
               "test/bench/test_bench_gpu_memory.py"]  # fmt: skip
    done = run([str(rehearsal["python"]), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                "-rs", *modules], timeout=900, env=env)  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, done.stdout[-3000:]


@pytest.mark.parametrize("inputs", ["built-here", "as-on-the-gpu-machine"])
def test_serves_a_video_pruned_at_three_quarters(rehearsal, inputs, request, tmp_path):
    """The CPU route in the rehearsal's Python 3.12. `built-here`: the tiny model built by this checkout's venv
    and the suite's H.264 clip; `as-on-the-gpu-machine`: serve_check.py builds the model with the image's
    transformers 5.17.0 and writes an MPEG-4 clip with OpenCV, as on the GPU machine. Either clip is decoded
    by the carried decord-over-OpenCV reader."""
    given = []
    if inputs == "built-here":
        model, media = request.getfixturevalue("tiny_model_dir"), request.getfixturevalue("media_dir")
        given = ["--model", str(model), "--clip", str(media / "moving.mp4")]
    report_path = tmp_path / "serve.json"
    env = clean_environment(SGLANG_USE_CPU_ENGINE="1", TORCHDYNAMO_DISABLE="1", HF_HUB_OFFLINE="1",
                            TRANSFORMERS_OFFLINE="1", SGLANG_EVS_TEST_COLD_START="1", **TORCH_2_11_ENV)  # fmt: skip
    cmd = [str(rehearsal["python"]), "scripts/gpu_pack/serve_check.py", "--device", "cpu", "--work", str(tmp_path),
           *given, "--report", str(report_path)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    report = json.loads(report_path.read_text())
    print(report)
    log = (tmp_path / "server.log").read_text(errors="replace")[-4000:] if (tmp_path / "server.log").exists() else ""
    assert done.returncode == 0 and report["ok"], f"{report}\n{done.stderr[-3000:]}\n{log}"
    assert report["video_tokens_kept"] < report["video_tokens_before"], report
    assert report["prompt_tokens_pruned"] < report["prompt_tokens_unpruned"], report
    assert report["chat_status"] == 200 and report["python"].startswith("3.12"), report
    # as on the GPU machine, where the GPU tests' fixtures write their clips the same way: no PyAV, OpenCV
    assert report["clip_writer"] == ("given" if inputs == "built-here" else "opencv"), report
