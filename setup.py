"""sglang-evs, the SGLang plugin. A GPU install is `pip install sglang-evs`: it brings SGLang 0.5.23
(whose own requirements carry its GPU path, flashinfer included) and puts nothing in site-packages that
runs at interpreter start; SGLang loads the plugin through its entry point. The CPU route's start-up
hook is a distribution of its own, `scripts/cpu_route/setup.py`, which only `scripts/setup_env.sh`
installs.
"""

from pathlib import Path

from setuptools import find_packages, setup

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
    install_requires=["torch", "sglang==0.5.23"],
    extras_require={
        "test": ["pytest", "pytest-timeout", "hypothesis", "ruff", "av", "requests", "openai"],
        "bench": ["matplotlib", "tqdm"],
    },
    entry_points={
        "sglang.srt.plugins": ["sglang_evs = sglang_evs.plugin:load_plugin"],
    },
)
