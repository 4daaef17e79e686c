"""The main job on a fresh machine: serve a video through SGLang with EVS and show what it saved.

    python -m sglang_evs.demo [--pruning-rate 0.75] [--model PATH]

Builds the bundled tiny Qwen3-VL (unless --model is given) and a clip with a small moving object
on a static background, starts `python -m sglang.launch_server` once, and asks about the clip at
q = 0 and at the given rate (a per-request setting), streamed. Prints a table (prompt tokens,
video tokens, time to first token), the reply, and the path of a picture of what EVS kept.
"""

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from sglang_evs import visualize
from sglang_evs.testing import media, tiny_model
from sglang_evs.testing.requests import flush_cache
from sglang_evs.testing.server import running_server

CACHE = Path(".cache/demo")


@dataclass(frozen=True)
class Answer:
    ttft_s: float  # streamed: request sent -> first content chunk
    prompt_tokens: int
    video_tokens: int
    text: str


def ask(base_url: str, video: Path, pruning_rate: float) -> Answer:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": f"file://{video.resolve()}"}},
            {"type": "text", "text": "What is happening in this video?"},
        ]}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "mm_processor_kwargs": {"video_pruning_rate": pruning_rate},
    }  # fmt: skip
    start, first, text, usage = time.perf_counter(), None, [], None
    with requests.post(f"{base_url}/v1/chat/completions", json=body, stream=True, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[len(b"data: ") :])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = first or time.perf_counter()
                text.append(chunk["choices"][0]["delta"]["content"])
            usage = chunk.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return Answer((first or time.perf_counter()) - start, usage["prompt_tokens"], details.get("video_tokens", 0),
                  "".join(text))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pruning-rate", type=float, default=0.75)
    parser.add_argument("--model", type=Path, help="a Qwen3-VL checkpoint (default: build the tiny one)")
    args = parser.parse_args()

    CACHE.mkdir(parents=True, exist_ok=True)
    model = args.model or tiny_model.build_tiny_qwen3_vl(CACHE / "tiny-qwen3-vl")
    video = media.write_clip(CACHE / "moving.mp4", "moving", num_frames=32, fps=4)
    rates = (0.0, args.pruning_rate)
    with running_server(model, CACHE / "server.log", ["--dtype", "float32"]) as server:
        for rate in rates:  # warm-up: first-request allocation costs, at each rate
            ask(server.base_url, video, rate)
        answers = {}
        for rate in rates:
            flush_cache(server.base_url)  # each measured request prefills from scratch
            answers[rate] = ask(server.base_url, video, rate)
    picture = CACHE / f"kept-q{args.pruning_rate}.png"
    visualize.draw(visualize.kept_tokens(model, video, args.pruning_rate)).save(picture)

    print(f"\n{'video_pruning_rate':<20}{'prompt tokens':>15}{'video tokens':>14}{'TTFT (streamed)':>17}")
    for rate, answer in answers.items():
        print(f"{rate:<20}{answer.prompt_tokens:>15}{answer.video_tokens:>14}{answer.ttft_s * 1000:>14.0f} ms")
    base, pruned = answers[0.0], answers[args.pruning_rate]
    print(f"\nEVS at q={args.pruning_rate} kept {pruned.video_tokens} of {base.video_tokens} video tokens; "
          f"the language model prefilled {base.prompt_tokens - pruned.prompt_tokens} fewer tokens "
          f"({100 * (1 - pruned.prompt_tokens / base.prompt_tokens):.0f} % fewer).")  # fmt: skip
    print(f"reply at q={args.pruning_rate} (random tiny model, so not meaningful text): {pruned.text!r}")
    print(f"what EVS kept, frame by frame: {picture}")


if __name__ == "__main__":
    main()
