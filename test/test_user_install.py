"""The install a GPU user makes, run on this CPU machine: `pip install sglang-evs` (the wheel built from this
checkout) into a fresh virtual environment resolves SGLang 0.5.23 and the torch and transformers it declares (PyPI's
builds: torch 2.14.1, a CUDA build; transformers 5.19.0); the plugin loads there and the tiny model serves a pruned
video.

What differs from a GPU machine, and why: the CPU route's start-up hook (`sglang-evs-cpu-route`, which a GPU install
never has) is installed beside it and `SGLANG_USE_CPU_ENGINE=1` set, to serve on the CPU; with no CUDA driver here,
SGLang's CUDA kernels (sglang-kernel, which SGLang's requirements bring) cannot load, and the CPU route stands in
for them as it does where they are absent (`runtime/import_fixes.sgl_kernel_installed`).

The environment takes pip about 7 minutes and 11 GB (torch's CUDA libraries): it is kept under `.cache/` for the next
run of the same requirements (the wheel's own and this Python's), the freshly built wheel reinstalled each time.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from sglang_evs.testing import media
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

pytestmark = pytest.mark.slow  # the full suite only (see pyproject.toml)

ROOT = Path(__file__).resolve().parents[1]
DECLARED = {"sglang": "0.5.23", "torch": "2.14.1", "transformers": "5.19.0"}  # SGLang 0.5.23's own requirements


def build_wheel(source: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w",
                    str(out), str(source)], check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return wheel


# What pip says when the registry cannot be reached or does not hold a release: the install cannot be made here
UNREACHABLE = ("No matching distribution found", "Could not find a version", "NewConnectionError", "Max retries")


def pip(python: Path, *args: str, timeout: float = 1800) -> None:
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    if done.returncode != 0 and any(sign in done.stderr for sign in UNREACHABLE):
        pytest.skip(f"the registry cannot give this install here: {done.stderr.strip()[-500:]}")
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def user_install(tmp_path_factory) -> Path:
    """The fresh environment's python, with the wheel and what pip resolved for it, and the CPU route's hook."""
    wheels = tmp_path_factory.mktemp("user_wheels")
    wheel, cpu_route = build_wheel(ROOT, wheels / "plugin"), build_wheel(ROOT / "scripts" / "cpu_route", wheels / "cpu")
    requirements = (ROOT / "pyproject.toml").read_text() + sys.version
    venv = ROOT / ".cache" / f"user-install-{hashlib.sha256(requirements.encode()).hexdigest()[:12]}"
    python, stamp = venv / "bin" / "python", venv / "resolved"
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
        pip(python, str(wheel))  # as a user would: the plugin, and what its requirements bring
        stamp.write_text("")
    pip(python, "--no-deps", "--force-reinstall", str(wheel), str(cpu_route))
    return python


def test_the_users_install_has_the_versions_sglang_declares(user_install):
    probe = "import json, torch, transformers, sglang; print(json.dumps({'sglang': sglang.__version__, " \
            "'torch': torch.__version__, 'transformers': transformers.__version__}))"  # fmt: skip
    found = json.loads(subprocess.run([str(user_install), "-c", probe], check=True, capture_output=True, text=True,
                                      timeout=300).stdout.splitlines()[-1])  # fmt: skip
    assert {name: version.split("+")[0] for name, version in found.items()} == DECLARED


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
