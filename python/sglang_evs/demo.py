"""The main job on a fresh machine: serve a video through SGLang with EVS and show what it saved.

    python -m sglang_evs.demo [--pruning-rate 0.75] [--pruning-method evs|vidcom2] [--model PATH]

Builds the bundled tiny Qwen3-VL (unless --model is given) and a clip with a small moving object
on a static background, starts `python -m sglang.launch_server` once, and asks about the clip at
q = 0 and at the given rate (per-request settings). Prints a table of prompt and video tokens, the
reply, and the path of a picture of what was kept. No timing: on the tiny model the vision tower and
the server's fixed costs outweigh the language model, so one request's latency says nothing about
pruning; the measured speed-ups, with their intervals, are in README.md and docs/benchmarks.md.

The demo prints only what it is about: the import-time warnings SGLang and transformers give in this
process (quantization backends a CPU lacks, Triton's fallback, progress bars) are silenced here; the
server's own output, warnings included, is in its log (`.cache/demo/server.log`).
"""

import argparse
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import requests

from sglang_evs.testing.requests import pruning_setting

CACHE = Path(".cache/demo")


@dataclass(frozen=True)
class Answer:
    prompt_tokens: int
    video_tokens: int
    text: str


def ask(base_url: str, video: Path, pruning_rate: float, method: str) -> Answer:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": f"file://{video.resolve()}"}},
            {"type": "text", "text": "What is happening in this video?"},
        ]}],
        "max_tokens": 16,
        "temperature": 0,
        "mm_processor_kwargs": pruning_setting(pruning_rate, method),
    }  # fmt: skip
    response = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    reply = response.json()
    usage = reply["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return Answer(usage["prompt_tokens"], details.get("video_tokens", 0), reply["choices"][0]["message"]["content"])


def quiet_libraries() -> None:
    """Silence, in this process only, what SGLang and transformers print at import and while building."""
    warnings.filterwarnings("ignore")
    logging.getLogger("sglang").setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pruning-rate", type=float, default=0.75)
    parser.add_argument("--pruning-method", choices=["evs", "vidcom2"], default="evs")
    parser.add_argument("--model", type=Path, help="a Qwen3-VL checkpoint (default: build the tiny one)")
    args = parser.parse_args()
    quiet_libraries()
    from sglang_evs import visualize
    from sglang_evs.testing import media, tiny_model
    from sglang_evs.testing.server import running_server

    CACHE.mkdir(parents=True, exist_ok=True)
    model = args.model or tiny_model.build_tiny_qwen3_vl(CACHE / "tiny-qwen3-vl")
    video = media.write_clip(CACHE / "moving.mp4", "moving", num_frames=32, fps=4)
    rates, method = (0.0, args.pruning_rate), args.pruning_method
    with running_server(model, CACHE / "server.log", ["--dtype", "float32"]) as server:
        answers = {rate: ask(server.base_url, video, rate, method) for rate in rates}
    picture = CACHE / f"kept-{method}-q{args.pruning_rate}.png"
    visualize.draw(visualize.kept_tokens(model, video, args.pruning_rate, method)).save(picture)

    print(f"\n{'video_pruning_rate':<20}{'prompt tokens':>15}{'video tokens':>14}")
    for rate, answer in answers.items():
        print(f"{rate:<20}{answer.prompt_tokens:>15}{answer.video_tokens:>14}")
    base, pruned = answers[0.0], answers[args.pruning_rate]
    print(f"\n{method} at q={args.pruning_rate} kept {pruned.video_tokens} of {base.video_tokens} video tokens; "
          f"the language model prefilled {base.prompt_tokens - pruned.prompt_tokens} fewer tokens "
          f"({100 * (1 - pruned.prompt_tokens / base.prompt_tokens):.0f} % fewer). Measured speed-ups: "
          "README.md, 'What it buys'.")  # fmt: skip
    print(f"reply at q={args.pruning_rate} (random tiny model, so not meaningful text): {pruned.text!r}")
    print(f"what {method} kept, frame by frame: {picture}")


if __name__ == "__main__":
    main()
