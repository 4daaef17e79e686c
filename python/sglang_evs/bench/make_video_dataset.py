"""Write synthetic mp4 clips with controllable redundancy and a dataset of SGLang's bench_serving for them.

    python -m sglang_evs.bench.make_video_dataset OUT_DIR [--num 8] [--static-share 0.5] [--kind moving|noise]
        [--object-size 12] [--seconds 4] [--size 64x64] [--fps 4] [--max-tokens 8] [--seed 0]

Writes ``OUT_DIR/clip_000.mp4 ...``, ``OUT_DIR/clips.json`` (kind of each clip),
``OUT_DIR/warmup.mp4`` (one more clip of the same shape, in no request: benchmarks warm the server up
on it, so that the first measured request does not pay for the first prefill of this size) and
``OUT_DIR/dataset.jsonl``, one OpenAI chat request per line, as read by

    python -m sglang.benchmark.serving --backend sglang-oai-chat --dataset-name openai \\
        --dataset-path OUT_DIR/dataset.jsonl --num-prompts N --base-url URL

Line format (sglang.benchmark.datasets.openai_dataset): ``messages`` (a ``video_url`` part with a
``file://`` absolute URL, then a text part), ``max_tokens`` (the output length), and
``stream_options.include_usage`` so that the server reports ``usage.prompt_tokens`` in the stream
(bench_serving then records the server's count, not its own chat-template estimate). Every other
key of a line is sent in the request body, so clip metadata lives in ``clips.json``, not here.

A fraction ``--static-share`` of the clips is fully static (every frame identical); the others
are ``--kind``: ``moving`` (a small square crossing a static background) or ``noise``.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from sglang_evs.testing import media

PROMPT = "Describe what happens in this video."
WARMUP_CLIP = "warmup.mp4"


def clip_kinds(num: int, static_share: float, kind: str, seed: int) -> list[str]:
    """``floor(num * static_share + 0.5)`` entries ``"static"``, the rest ``kind``, in a seeded shuffled order."""
    if not 0.0 <= static_share <= 1.0:
        raise ValueError(f"static share must be in [0, 1], got {static_share}")
    num_static = int(num * static_share + 0.5)
    kinds = ["static"] * num_static + [kind] * (num - num_static)
    np.random.default_rng(seed).shuffle(kinds)
    return kinds


def request_line(video: Path, max_tokens: int, prompt: str = PROMPT, sound: Path | None = None) -> dict:
    """One dataset line: an OpenAI chat request with one video, its `sound` (an audio part) if given, and one
    text part."""
    content = [
        {"type": "video_url", "video_url": {"url": f"file://{video.resolve()}"}},
        *([{"type": "audio_url", "audio_url": {"url": f"file://{sound.resolve()}"}}] if sound else []),
        {"type": "text", "text": prompt},
    ]
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
    }


def parse_size(size: str) -> tuple[int, int]:
    """``"HxW"`` -> ``(H, W)``."""
    height, width = (int(v) for v in size.lower().split("x"))
    return height, width


def make_video_dataset(
    out_dir: str | Path,
    num: int = 8,
    static_share: float = 0.5,
    kind: str = "moving",
    object_size: int = 12,
    seconds: float = 4.0,
    size: tuple[int, int] = (64, 64),
    fps: int = 4,
    max_tokens: int = 8,
    seed: int = 0,
    with_sound: bool = False,
) -> Path:
    """Write the clips, ``clips.json`` and ``dataset.jsonl``; return the path of ``dataset.jsonl``.
    ``with_sound``: every request also carries a tone as long as its clip (for models that hear)."""
    if kind not in ("moving", "noise"):
        raise ValueError(f"kind must be moving or noise, got {kind!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    num_frames = max(2, int(round(seconds * fps)))
    height, width = size
    clips, lines = [], []
    for i, clip_kind in enumerate(clip_kinds(num, static_share, kind, seed)):
        path = media.write_clip(
            out / f"clip_{i:03d}.mp4", clip_kind, fps=fps, num_frames=num_frames,
            height=height, width=width, seed=seed + i, object_size=object_size,
        )  # fmt: skip
        sound = None
        if with_sound:
            sound = media.write_tone(out / f"clip_{i:03d}.m4a", seconds=seconds, frequency=220.0 * (1 + i))
        clips.append({"file": path.name, "kind": clip_kind, "num_frames": num_frames, "fps": fps})
        lines.append(json.dumps(request_line(path, max_tokens, sound=sound)))
    media.write_clip(
        out / WARMUP_CLIP, kind, fps=fps, num_frames=num_frames, height=height, width=width, seed=seed + num,
        object_size=object_size,
    )  # fmt: skip
    (out / "clips.json").write_text(json.dumps(clips, indent=1))
    dataset = out / "dataset.jsonl"
    dataset.write_text("\n".join(lines) + "\n")
    return dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--num", type=int, default=8)
    parser.add_argument("--static-share", type=float, default=0.5)
    parser.add_argument("--kind", choices=["moving", "noise"], default="moving", help="kind of the non-static clips")
    parser.add_argument("--object-size", type=int, default=12, help="side of the moving square in pixels")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--size", default="64x64", help="HxW")
    parser.add_argument("--fps", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8, help="output length of every request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--with-sound", action="store_true", help="a tone beside every clip (Qwen3-Omni)")
    args = parser.parse_args()
    path = make_video_dataset(
        args.out_dir, args.num, args.static_share, args.kind, args.object_size,
        args.seconds, parse_size(args.size), args.fps, args.max_tokens, args.seed, args.with_sound,
    )  # fmt: skip
    print(path)


if __name__ == "__main__":
    main()
