"""sglang-evs-gpu-route: the one file that starts sglang-evs's GPU route (no sglang-kernel, no flashinfer)
in every Python process.

SGLang imports `sgl_kernel` at module import time on CUDA, in its scheduler subprocesses before they load any
plugin, so the route's stand-in must be in place from interpreter start: a `.pth` file at the root of
site-packages does that (the same bootstrap as the CPU route's `.pth`). Only a GPU machine that cannot install
`sglang-kernel` installs this distribution, on purpose; a regular GPU install of sglang-evs has no `.pth`.
Even here the hook does nothing without `SGLANG_EVS_GPU_ROUTE=1`, nor where a real `sgl_kernel` is importable
(`sglang_evs.runtime.bootstrap`, `sglang_evs.runtime.gpu_route`; docs/gpu-route.md).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

PTH_NAME = "sglang_evs_gpu_route.pth"
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
    name="sglang-evs-gpu-route",
    version="0.1.0",
    description="Starts sglang-evs's GPU route at interpreter start: SGLang 0.5.23 on CUDA without sglang-kernel",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=[],
    install_requires=["sglang-evs==0.1.0"],
    distclass=PthOnly,
    cmdclass={"build_py": BuildPyWithPth},
)
