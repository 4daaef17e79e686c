"""The main job on a fresh machine: serve a video through SGLang with EVS and show what it saved.

    python -m sglang_evs.demo [--pruning-rate 0.75] [--model PATH]

Builds the bundled tiny Qwen3-VL (unless --model is given) and a clip with a
small moving object on a static background, then serves the same request
twice through `python -m sglang.launch_server`: EVS off, and EVS at the given
rate. Prints the prompt tokens, video tokens and time-to-answer of both.
"""

import argparse
import time
from pathlib import Path

import requests

from sglang_evs.testing import media, tiny_model
from sglang_evs.testing.requests import flush_cache
from sglang_evs.testing.server import running_server

CACHE = Path(".cache/demo")


def ask(base_url: str, video: Path) -> tuple[dict, float]:
    body = {
        "model": "demo",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "video_url", "video_url": {"url": f"file://{video.resolve()}"}},
                    {"type": "text", "text": "What is happening in this video?"},
                ],
            }
        ],
        "max_tokens": 16,
        "temperature": 0,
    }
    start = time.perf_counter()
    response = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()["usage"], time.perf_counter() - start


def serve_once(model: Path, video: Path, pruning_rate: float) -> tuple[dict, float]:
    args = ["--dtype", "float32", "--json-model-override-args", f'{{"video_pruning_rate": {pruning_rate}}}']
    log = CACHE / f"server-q{pruning_rate}.log"
    with running_server(model, log, args) as server:
        ask(server.base_url, video)  # warm-up: first-request compile and allocation costs
        flush_cache(server.base_url)  # so the measured request prefills from scratch
        return ask(server.base_url, video)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pruning-rate", type=float, default=0.75)
    parser.add_argument("--model", type=Path, help="a Qwen3-VL checkpoint (default: build the tiny one)")
    args = parser.parse_args()

    CACHE.mkdir(parents=True, exist_ok=True)
    model = args.model or tiny_model.build_tiny_qwen3_vl(CACHE / "tiny-qwen3-vl")
    video = media.write_clip(CACHE / "moving.mp4", "moving", num_frames=16, fps=4)

    rows = []
    for rate in (0.0, args.pruning_rate):
        usage, seconds = serve_once(model, video, rate)
        rows.append((rate, usage["prompt_tokens"], seconds))
        print(f"video_pruning_rate={rate:<5} prompt_tokens={usage['prompt_tokens']:<6} time={seconds:.3f}s")
    (_, base_tokens, base_s), (rate, pruned_tokens, pruned_s) = rows
    saved = base_tokens - pruned_tokens
    print(
        f"EVS at q={rate} saved {saved} of {base_tokens} prompt tokens "
        f"({100 * saved / base_tokens:.1f}%); time {base_s:.3f}s -> {pruned_s:.3f}s"
    )


if __name__ == "__main__":
    main()
