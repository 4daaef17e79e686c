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
