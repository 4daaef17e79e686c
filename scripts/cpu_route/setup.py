"""sglang-evs-cpu-route: the one file that starts sglang-evs's CPU runtime in every Python process.

SGLang imports `sgl_kernel` and touches `torch.ops.sgl_kernel.*` at module import time, in its
scheduler subprocesses before they load any plugin, so the CPU route's import fixes must be in place
from interpreter start: a `.pth` file at the root of site-packages does that. Only the CPU route
(`scripts/setup_env.sh`: tests, demo, CPU benchmarks) installs this distribution; a GPU install of
sglang-evs has no `.pth` and runs nothing of the plugin until SGLang loads its entry point.
Even here the hook does nothing without `SGLANG_USE_CPU_ENGINE=1` (`sglang_evs.runtime.bootstrap`).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

PTH_NAME = "sglang_evs_cpu_runtime.pth"
PTH_LINE = "import sglang_evs.runtime.bootstrap\n"


class PthOnly(Distribution):
    """No Python package of its own, yet a pure wheel: setuptools runs build_py only for those."""

    def has_pure_modules(self) -> bool:
        return True


class BuildPyWithPth(build_py):
    """The wheel's only file: the .pth, at the root of site-packages."""

    def run(self) -> None:
        super().run()
        Path(self.build_lib).mkdir(parents=True, exist_ok=True)
        (Path(self.build_lib) / PTH_NAME).write_text(PTH_LINE)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH_NAME)]


setup(
    name="sglang-evs-cpu-route",
    version="0.1.0",
    description="Starts sglang-evs's CPU runtime at interpreter start, so SGLang 0.5.23 serves without a GPU",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=[],
    install_requires=["sglang-evs==0.1.0"],
    distclass=PthOnly,
    cmdclass={"build_py": BuildPyWithPth},
)
