"""Packaged like a serving plugin: a GPU install runs nothing at interpreter start; the CPU route's hook and the
GPU route's (CUDA without sglang-kernel) are distributions of their own.

The wheels are built from this checkout with pip (no build isolation: setuptools is in the test
environment, nothing is downloaded) and installed without dependencies into a fresh virtual
environment, as `pip install sglang-evs` installs the package itself on a GPU machine.
"""

import importlib.metadata
import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_ROUTE = ROOT / "scripts" / "cpu_route"
GPU_ROUTE = ROOT / "scripts" / "gpu_route"
PTH = "sglang_evs_cpu_runtime.pth"


def build_wheel(source: Path, out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(out),
         str(source)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return wheel


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


def test_the_wheel_holds_the_package_and_no_startup_hook(gpu_install):
    _, files = gpu_install
    assert not [name for name in files if name.endswith(".pth")]
    assert {name.split("/")[0] for name in files} == {"sglang_evs", "sglang_evs-0.1.0.dist-info"}
    package = [name for name in files if name.startswith("sglang_evs/")]
    assert "sglang_evs/plugin.py" in package and all(name.endswith(".py") for name in package)  # no data files


def test_a_gpu_install_runs_nothing_of_the_plugin_at_interpreter_start(gpu_install):
    python, _ = gpu_install
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    assert not list(Path(site).glob("*sglang_evs*.pth"))
    started = subprocess.run([str(python), "-X", "importtime", "-c", "pass"], check=True, capture_output=True,
                             text=True)  # fmt: skip
    assert "import time" in started.stderr and "sglang_evs" not in started.stderr


def test_sglang_still_finds_the_plugin_entry_point(gpu_install):
    python, _ = gpu_install
    probe = ("import json, importlib.metadata as m; "
             "print(json.dumps({e.name: e.value for e in m.entry_points(group='sglang.srt.plugins')}))")  # fmt: skip
    found = subprocess.run([str(python), "-c", probe], check=True, capture_output=True, text=True).stdout
    assert json.loads(found) == {"sglang_evs": "sglang_evs.plugin:load_plugin"}
    requires = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.requires('sglang-evs'))"],
                              check=True, capture_output=True, text=True).stdout  # fmt: skip
    assert "sglang==0.5.23" in requires  # the version the plugin refuses to run without


def test_the_cpu_route_distribution_is_the_startup_hook_alone(tmp_path):
    files = zipfile.ZipFile(build_wheel(CPU_ROUTE, tmp_path)).namelist()
    assert [name for name in files if not name.startswith("sglang_evs_cpu_route-")] == [PTH]


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
