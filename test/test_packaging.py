"""Packaged like a serving plugin: a GPU install runs nothing at interpreter start; the CPU route's hook and the
GPU route's (CUDA without sglang-kernel) are distributions of their own.

The wheels are built from this checkout with pip (no build isolation: setuptools is in the test
environment, nothing is downloaded) and installed without dependencies into a fresh virtual
environment, as `pip install sglang-evs` installs the package itself on a GPU machine; and with the dependencies
pip resolves for it, as a GPU user's install is (the last section). Building wheels and environments is the slow
tier's; the quick tier checks the hook of this test environment.
"""

import importlib.metadata
import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest
import requests

from sglang_evs.testing import media
from sglang_evs.testing import user_install as user_install_env
from sglang_evs.testing.requests import VIDEO, chat_prompt
from sglang_evs.testing.server import (
    cpu_server_args,
    free_port,
    local_url,
    server_environment,
    spawn,
    stop,
    wait_healthy,
)
from sglang_evs.testing.user_install import build_wheel

ROOT = Path(__file__).resolve().parents[1]
CPU_ROUTE = ROOT / "scripts" / "cpu_route"
GPU_ROUTE = ROOT / "scripts" / "gpu_route"
PTH = "sglang_evs_cpu_runtime.pth"


@pytest.fixture(scope="module")
def gpu_install(tmp_path_factory) -> tuple[Path, list[str]]:
    """A fresh virtual environment with only the sglang-evs wheel in it: (its python, the wheel's files)."""
    tmp = tmp_path_factory.mktemp("packaging")
    wheel = build_wheel(ROOT, tmp / "wheel")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    return python, zipfile.ZipFile(wheel).namelist()


@pytest.mark.slow  # builds wheels and a virtual environment: ~6 s the quick tier need not wait for
def test_the_wheel_holds_the_package_and_no_startup_hook(gpu_install):
    _, files = gpu_install
    assert not [name for name in files if name.endswith(".pth")]
    assert {name.split("/")[0] for name in files} == {"sglang_evs", "sglang_evs-0.1.0.dist-info"}
    package = [name for name in files if name.startswith("sglang_evs/")]
    assert "sglang_evs/plugin.py" in package and all(name.endswith(".py") for name in package)  # no data files


@pytest.mark.slow
def test_a_gpu_install_runs_nothing_of_the_plugin_at_interpreter_start(gpu_install):
    python, _ = gpu_install
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    assert not list(Path(site).glob("*sglang_evs*.pth"))
    started = subprocess.run([str(python), "-X", "importtime", "-c", "pass"], check=True, capture_output=True,
                             text=True)  # fmt: skip
    assert "import time" in started.stderr and "sglang_evs" not in started.stderr


@pytest.mark.slow
def test_sglang_still_finds_the_plugin_entry_point(gpu_install):
    python, _ = gpu_install
    probe = ("import json, importlib.metadata as m; "
             "print(json.dumps({e.name: e.value for e in m.entry_points(group='sglang.srt.plugins')}))")  # fmt: skip
    found = subprocess.run([str(python), "-c", probe], check=True, capture_output=True, text=True).stdout
    assert json.loads(found) == {"sglang_evs": "sglang_evs.plugin:load_plugin"}
    requires = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.requires('sglang-evs'))"],
                              check=True, capture_output=True, text=True).stdout  # fmt: skip
    assert "sglang==0.5.23" in requires  # the version the plugin refuses to run without


@pytest.mark.slow
def test_the_cpu_route_distribution_is_the_startup_hook_alone(tmp_path):
    files = zipfile.ZipFile(build_wheel(CPU_ROUTE, tmp_path)).namelist()
    assert [name for name in files if not name.startswith("sglang_evs_cpu_route-")] == [PTH]


@pytest.mark.slow
def test_the_gpu_route_distribution_is_the_same_startup_hook_under_its_own_name(tmp_path):
    """`sglang-evs-gpu-route` (CUDA without sglang-kernel, docs/gpu-route.md): only its `.pth`, the bootstrap."""
    wheel = zipfile.ZipFile(build_wheel(GPU_ROUTE, tmp_path))
    files = wheel.namelist()
    assert [name for name in files if not name.startswith("sglang_evs_gpu_route-")] == ["sglang_evs_gpu_route.pth"]
    assert wheel.read("sglang_evs_gpu_route.pth").decode() == "import sglang_evs.runtime.bootstrap\n"


def test_this_test_environment_has_the_hook_from_the_cpu_route_distribution():
    """What `scripts/setup_env.sh` installs: the `.pth` belongs to sglang-evs-cpu-route, not to sglang-evs."""
    site = Path(sysconfig.get_paths()["purelib"])
    assert (site / PTH).read_text() == "import sglang_evs.runtime.bootstrap\n"
    owned = {str(f) for f in importlib.metadata.distribution("sglang-evs-cpu-route").files or ()}
    assert PTH in owned
    assert PTH not in {str(f) for f in importlib.metadata.distribution("sglang-evs").files or ()}


@pytest.mark.slow
def test_the_metadata_is_pep_621s_and_refuses_python_3_10(tmp_path):
    """`pyproject.toml` is the one source: Python 3.11 or later (SGLang 0.5.23's own floor), so pip refuses the wheel
    for 3.10 instead of installing a plugin whose SGLang cannot run there."""
    import tomllib

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"] == ">=3.11"
    build_wheel(ROOT, tmp_path / "wheels")

    def fetch(python: str) -> subprocess.CompletedProcess:
        """pip resolving the package, from the built wheel alone, for an interpreter of version `python`."""
        return subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-index", "--find-links", tmp_path / "wheels",
             "--python-version", python, "--only-binary", ":all:", "-d", tmp_path / python, "sglang-evs"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    refused, taken = fetch("3.10"), fetch("3.12")
    assert refused.returncode != 0 and "requires a different Python: 3.10.0 not in '>=3.11'" in refused.stderr
    assert taken.returncode == 0, taken.stderr


@pytest.mark.slow
def test_each_console_script_is_a_function_of_the_package_that_returns_nothing(gpu_install):
    """The console scripts a user runs (the launcher, the demo, the visualizer, the benchmarks and accuracy runners)
    name functions that exist; each returns None, so the script's exit status is 0 when it succeeds."""
    import importlib
    import inspect

    python, _ = gpu_install
    found = subprocess.run(
        [str(python), "-c", "import json, importlib.metadata as m; "
         "print(json.dumps({e.name: e.value for e in m.entry_points(group='console_scripts')}))"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    targets = {name: value for name, value in json.loads(found).items() if value.startswith("sglang_evs")}
    assert {"sglang-evs-launch-server", "sglang-evs-visualize", "sglang-evs-sweep"} <= set(targets), targets
    for name, target in targets.items():
        module, function = target.split(":")
        signature = inspect.signature(getattr(importlib.import_module(module), function))
        assert signature.return_annotation in (None, "None"), (name, signature)


# --- the install a GPU user makes, run on this CPU machine (slow tier; `sglang_evs.testing.user_install`).
#
# What differs from a GPU machine, and why: the CPU route's start-up hook (`sglang-evs-cpu-route`, which a GPU install
# never has) is installed beside it and `SGLANG_USE_CPU_ENGINE=1` set, to serve on the CPU; with no CUDA driver here,
# SGLang's CUDA kernels (sglang-kernel, which SGLang's requirements bring) cannot load, and the CPU route stands in
# for them as it does where they are absent (`runtime/import_fixes.sgl_kernel_installed`).

# SGLang 0.5.23's own requirements (torchcodec: its video decoder on x86, which it picks wherever it imports)
DECLARED = {"sglang": "0.5.23", "torch": "2.14.1", "transformers": "5.19.0", "torchcodec": "0.17.0"}


@pytest.fixture(scope="module")
def user_install() -> Path:
    """The fresh environment's python, with the wheel and what pip resolved for it, and the CPU route's hook."""
    try:
        return user_install_env.result(ROOT)
    except user_install_env.Unreachable as unreachable:
        pytest.skip(f"the registry cannot give this install here: {unreachable}")


@pytest.mark.slow
def test_the_users_install_has_the_versions_sglang_declares(user_install):
    probe = "import json, torch, torchcodec, transformers, sglang; print(json.dumps({'sglang': sglang.__version__, " \
            "'torch': torch.__version__, 'transformers': transformers.__version__, " \
            "'torchcodec': torchcodec.__version__}))"  # fmt: skip
    found = json.loads(subprocess.run([str(user_install), "-c", probe], check=True, capture_output=True, text=True,
                                      timeout=300).stdout.splitlines()[-1])  # fmt: skip
    assert {name: version.split("+")[0] for name, version in found.items()} == DECLARED


@pytest.mark.slow
def test_the_users_install_serves_a_pruned_video(user_install, tiny_model_dir, tmp_path):
    clip = media.write_clip(tmp_path / "clip.mp4", "noise", num_frames=16, fps=4, seed=3)
    port = free_port()
    args = ["--model-path", str(tiny_model_dir), "--host", "127.0.0.1", "--port", str(port),
            *cpu_server_args(tiny_model_dir), "--dtype", "float32"]  # fmt: skip
    log = tmp_path / "server.log"
    process = spawn([str(user_install), "-m", "sglang.launch_server", *args], log, server_environment(True))
    try:
        wait_healthy(local_url(port), process, log, timeout=300)
        body = {"text": chat_prompt(VIDEO), "video_data": [str(clip)],
                "mm_processor_kwargs": {"video_pruning_rate": 0.75},
                "sampling_params": {"max_new_tokens": 4, "temperature": 0}}  # fmt: skip
        reply = requests.post(f"{local_url(port)}/generate", json=body, timeout=300)
        assert reply.status_code == 200, reply.text
        meta = reply.json()["meta_info"]
        assert meta["video_tokens_after_pruning"] == meta["video_tokens_before_pruning"] // 4 > 0, meta
        assert "sglang-evs 0.1.0 plugin loaded" in log.read_text()
    finally:
        stop(process)


DECODE = """import sys, numpy
from sglang.srt.utils import video_decoder
print(video_decoder._BACKEND)
for clip in sys.argv[1:]:
    reader = video_decoder.VideoDecoderWrapper(clip)
    numpy.save(clip + ".npy", reader.get_frames_as_tensor(list(range(len(reader)))).numpy())
    print(float(reader.avg_fps))
"""


@pytest.mark.slow
def test_the_users_install_decodes_with_the_torchcodec_sglang_declares_as_decord_does(user_install, tmp_path,
                                                                                     monkeypatch):  # fmt: skip
    """SGLang's `VideoDecoderWrapper` in the user's environment picks torchcodec (the version SGLang declares, over
    its own torch), and the suite's clips decode there to every frame, count and fps that decord gives here."""
    from sglang.srt.utils import video_decoder

    clips = [
        media.write_clip(tmp_path / f"{kind}.mp4", kind, num_frames=16, fps=4, seed=3) for kind in media.CLIP_KINDS
    ]
    there = subprocess.run([str(user_install), "-c", DECODE, *map(str, clips)], capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert there.returncode == 0, there.stderr[-3000:]
    backend, *fps_there = there.stdout.split()
    assert backend == "torchcodec"
    monkeypatch.setattr(video_decoder, "_BACKEND", "decord")
    for clip, fps in zip(clips, fps_there, strict=True):
        reader = video_decoder.VideoDecoderWrapper(str(clip))
        frames = reader.get_frames_as_tensor(list(range(len(reader)))).numpy()
        torchcodec_frames = np.load(f"{clip}.npy")
        assert torchcodec_frames.shape[0] == 16 and np.array_equal(torchcodec_frames, frames), clip.name
        assert float(fps) == float(reader.avg_fps), clip.name


@pytest.mark.slow  # asks the registry
def test_the_install_skips_only_where_the_registry_cannot_be_reached():
    """A pin that no release satisfies fails: pip reaches the registry and finds nothing (where it cannot reach
    it, the install cannot be made here, and this test skips by the same rule the user's install skips by)."""
    try:
        user_install_env.pip(Path(sys.executable), "--dry-run", "--no-deps", "sglang==0.0.0.9999")
    except user_install_env.Unreachable as unreachable:
        pytest.skip(f"the registry cannot be reached here: {unreachable}")
    except RuntimeError as failure:
        assert "No matching distribution found" in str(failure) or "Could not find a version" in str(failure)
    else:
        raise AssertionError("pip installed a release of SGLang that does not exist")
