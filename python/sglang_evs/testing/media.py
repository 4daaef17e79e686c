"""Synthetic PNG images and H.264 mp4 clips with controllable redundancy, and AAC tones.

    python -m sglang_evs.testing.media OUT_DIR   # writes one of each kind

Clip kinds:
  static   every frame identical (maximal redundancy: EVS keeps only frame 0)
  moving   a static textured background with a small square moving across it
  noise    every frame fresh uniform noise (no redundancy)

Tones are AAC in an MP4 container: SGLang 0.5.23 decodes such containers with PyAV; its WAV path
needs torchaudio, which the CPU route does not install.
"""

import argparse
import importlib.util
from fractions import Fraction
from pathlib import Path

import numpy as np

CLIP_KINDS = ("static", "moving", "noise")
# A 16-frame 4 fps clip (`write_clip(..., num_frames=16, fps=4)`) on the tiny Qwen3-VL: 8 sampled frames ->
# 4 groups of 10x10 tokens.
GROUPS, TOKENS_PER_GROUP = 4, 100


def background(height: int, width: int, seed: int) -> np.ndarray:
    """A smooth, deterministic RGB texture. Returns uint8 [H, W, 3]."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    channels = []
    for _ in range(3):
        fx, fy, phase = rng.uniform(1, 4), rng.uniform(1, 4), rng.uniform(0, 2 * np.pi)
        channels.append(0.5 + 0.5 * np.sin(2 * np.pi * (fx * x + fy * y) + phase))
    return (np.stack(channels, axis=-1) * 255).astype(np.uint8)


def clip_frames(
    kind: str,
    num_frames: int = 8,
    height: int = 64,
    width: int = 64,
    seed: int = 0,
    object_size: int = 12,
) -> np.ndarray:
    """Frames of one clip. Returns uint8 [num_frames, H, W, 3]."""
    if kind not in CLIP_KINDS:
        raise ValueError(f"clip kind must be one of {CLIP_KINDS}, got {kind!r}")
    if kind == "noise":
        rng = np.random.default_rng(seed)
        return rng.integers(0, 256, size=(num_frames, height, width, 3), dtype=np.uint8)
    frames = np.repeat(background(height, width, seed)[None], num_frames, axis=0)
    if kind == "moving":
        size = min(object_size, height, width)
        for i, frame in enumerate(frames):
            left = (i * max(1, (width - size) // max(1, num_frames - 1))) % (width - size + 1)
            top = (height - size) // 2
            frame[top : top + size, left : left + size] = (255, 32, 32)
    return frames


def video_writer() -> str:
    """What `write_mp4` encodes with here: "pyav" (H.264, near-lossless) where PyAV is installed, else "opencv"
    (MPEG-4 Part 2: the GPU machine has OpenCV, whose FFmpeg it bundles, and no PyAV)."""
    return "pyav" if importlib.util.find_spec("av") is not None else "opencv"


def write_mp4(
    path: str | Path, frames: np.ndarray, fps: int | Fraction = 4, soundtrack: np.ndarray | None = None
) -> Path:
    """Encode uint8 [T, H, W, 3] frames as H.264 (yuv420p, near-lossless) with PyAV; `soundtrack` (mono
    float32 samples at SOUND_RATE) as an AAC stream beside them. Without PyAV, silent clips only, with OpenCV."""
    if video_writer() == "opencv":
        if soundtrack is not None:
            raise RuntimeError("a clip with a soundtrack needs PyAV (the `av` package), which is not installed")
        return write_mp4_opencv(path, frames, fps)
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _, height, width, _ = frames.shape
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "1", "preset": "veryfast"}
        sound = None if soundtrack is None else _aac_stream(container)
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            _encode_sound(container, sound, soundtrack)
    return path


def write_mp4_opencv(path: str | Path, frames: np.ndarray, fps: int = 4) -> Path:
    """uint8 RGB [T, H, W, 3] frames as MPEG-4 Part 2 written by OpenCV."""
    import cv2

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, frames.shape[2:0:-1])
    for frame in frames:
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()
    if not path.is_file() or path.stat().st_size == 0:
        raise RuntimeError(f"OpenCV wrote no clip at {path}")
    return path


def write_clip(path: str | Path, kind: str, fps: int = 4, soundtrack: np.ndarray | None = None, **frame_kwargs) -> Path:
    return write_mp4(path, clip_frames(kind, **frame_kwargs), fps=fps, soundtrack=soundtrack)


def write_image(path: str | Path, height: int = 64, width: int = 64, seed: int = 0) -> Path:
    """A PNG of the background texture with a seed-dependent colored square."""
    from PIL import Image

    image = background(height, width, seed)
    rng = np.random.default_rng(seed + 1)
    size = max(4, min(height, width) // 4)
    top, left = rng.integers(0, height - size + 1), rng.integers(0, width - size + 1)
    image[top : top + size, left : left + size] = rng.integers(0, 256, size=3, dtype=np.uint8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path)
    return path


SOUND_RATE = 16000  # samples per second of the tones written here


def tone(seconds: float = 2.0, frequency: float = 440.0) -> np.ndarray:
    """A mono tone whose loudness swells three times a second: float32 samples at SOUND_RATE."""
    t = np.arange(int(seconds * SOUND_RATE)) / SOUND_RATE
    return (0.3 * np.sin(2 * np.pi * frequency * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def write_tone(path: str | Path, seconds: float = 2.0, frequency: float = 440.0) -> Path:
    """`tone` as AAC in an MP4 (.m4a) container."""
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w", format="mp4") as container:
        _encode_sound(container, _aac_stream(container), tone(seconds, frequency))
    return path


def _aac_stream(container):
    stream = container.add_stream("aac", rate=SOUND_RATE)
    stream.layout = "mono"
    return stream


def _encode_sound(container, stream, samples: np.ndarray) -> None:
    import av

    frame = av.AudioFrame.from_ndarray(samples[None, :], format="fltp", layout="mono")
    frame.sample_rate = SOUND_RATE
    for packet in [*stream.encode(frame), *stream.encode(None)]:
        container.mux(packet)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--fps", type=int, default=4)
    args = parser.parse_args()
    out = Path(args.out_dir)
    print(write_image(out / "image.png", args.size, args.size))
    for kind in CLIP_KINDS:
        size = {"height": args.size, "width": args.size}
        print(write_clip(out / f"{kind}.mp4", kind, fps=args.fps, num_frames=args.frames, **size))
    print(write_tone(out / "tone.m4a"))


if __name__ == "__main__":
    main()
