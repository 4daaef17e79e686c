from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

# The CPU runtime must be active in every Python process SGLang spawns, before
# SGLang's own imports run there, so it starts from a .pth file at the root of
# site-packages. Without SGLANG_USE_CPU_ENGINE=1 (any GPU install) it does nothing.
PTH_NAME = "sglang_evs_cpu_runtime.pth"
PTH_LINE = "import sglang_evs.runtime.bootstrap\n"


class BuildPyWithPth(build_py):
    """Regular wheels: ship the .pth beside the package."""

    def run(self) -> None:
        super().run()
        (Path(self.build_lib) / PTH_NAME).write_text(PTH_LINE)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH_NAME)]


class _StrategyWithPth:
    def __init__(self, strategy) -> None:
        self.strategy = strategy

    def __call__(self, wheel, files, mapping) -> None:
        self.strategy(wheel, files, mapping)
        wheel.writestr(PTH_NAME, PTH_LINE)

    def __enter__(self):
        self.strategy.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self.strategy.__exit__(*exc_info)


class EditableWheelWithPth(editable_wheel):
    """`pip install -e .`: setuptools builds editable wheels without build_py outputs."""

    def _select_strategy(self, *args, **kwargs):
        return _StrategyWithPth(super()._select_strategy(*args, **kwargs))


setup(
    name="sglang-evs",
    version="0.1.0",
    description=(
        "Exact video-token pruning (EVS, VidCom2) for SGLang's Qwen VLMs (Qwen3-VL/-MoE, Qwen3.5/3.6, "
        "Qwen2.5-VL, Qwen2-VL), as an SGLang plugin"
    ),
    long_description=Path("README.md").read_text() if Path("README.md").exists() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    package_dir={"": "python"},
    packages=find_packages("python"),
    install_requires=["torch"],
    extras_require={
        "test": ["pytest", "pytest-timeout", "hypothesis", "ruff", "av", "requests", "openai"],
        "bench": ["matplotlib", "tqdm"],
    },
    entry_points={
        "sglang.srt.plugins": ["sglang_evs = sglang_evs.plugin:load_plugin"],
    },
    cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth},
)
