"""sglang-evs-decord-cv2: the part of decord's API SGLang 0.5.23 decodes videos with, over OpenCV.

SGLang 0.5.23 reads videos with torchcodec, else decord (`sglang.srt.utils.video_decoder`). The GPU
machine has neither, but has OpenCV (opencv-python-headless, with its own FFmpeg); carrying decord2
(27 MB) or torchcodec plus FFmpeg would not fit one device call beside SGLang's own 39 MB wheel. Only the
GPU machine's carried wheel set (scripts/gpu_wheels.py) installs this; never install it beside a real decord.
"""

from setuptools import setup

setup(
    name="sglang-evs-decord-cv2",
    version="0.1.0",
    description="decord's VideoReader (what SGLang 0.5.23 uses of it) over OpenCV",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=["decord"],
    install_requires=["numpy", "opencv-python-headless"],
)
