"""sglang-evs's package metadata is PEP 621's, in `pyproject.toml`: its one source. This file only lets tools that
still call `setup.py` build the same package."""

from setuptools import setup

setup()
