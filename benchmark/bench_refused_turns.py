"""What refused stream turns leave in the tokenizer process: its resident memory after N refused continued segments
in a streaming session, beside the same N refused requests outside any session, on one server.

    python benchmark/bench_refused_turns.py [--model-path M] [--turns 120] [--size 448x448] [--output r.json]

One CPU server of the tiny Qwen3-VL with streaming sessions. A session's first segment is served; then each of
`--turns` continued segments (`video_stream`, 2 s at 4 fps, distinct content) is refused in the tokenizer after its
media were processed (`max_new_tokens` past the context: HTTP 400). The same number of such requests, without a
session, are the baseline. Printed: the tokenizer's RSS growth of each arm, and their difference per turn. Goal
(issue "Bounded under load"): under 150 MB for 120 session turns (430 MB for 150 before the pending turns were
bounded and a refused turn's record dropped).
"""

import argparse
import json
from pathlib import Path

import psutil
import requests

from sglang_evs.bench.launch import benchmark_model
from sglang_evs.testing import media
from sglang_evs.testing.requests import VIDEO, chat_prompt, generate, open_session
from sglang_evs.testing.server import running_server

TOO_MANY = 10**6  # new tokens: past any context, refused in the tokenizer's validation


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def refused_arm(base_url: str, pid: int, clips: list[Path], session: str | None) -> float:
    """The tokenizer's RSS growth (MB) over one refused request per clip."""
    before = rss_mb(pid)
    for clip in clips:
        body = {"text": chat_prompt(VIDEO), "video_data": [str(clip)], "sampling_params": {"max_new_tokens": TOO_MANY},
                "mm_processor_kwargs": {"video_pruning_rate": 0.5, **({"video_stream": True} if session else {})},
                **({"session_params": {"id": session}} if session else {})}  # fmt: skip
        reply = requests.post(f"{base_url}/generate", json=body, timeout=120)
        assert reply.status_code == 400, reply.text[:500]
    return rss_mb(pid) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="default: the tiny Qwen3-VL, built in the work folder")
    parser.add_argument("--turns", type=int, default=120)
    parser.add_argument("--size", default="448x448")
    parser.add_argument("--output", type=Path, default=Path("bench-refused-turns.json"))
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    work = args.output.resolve().parent / "bench-refused-turns"
    work.mkdir(parents=True, exist_ok=True)
    clips = [
        media.write_clip(work / f"seg-{i}.mp4", "noise", fps=4, num_frames=8, height=height, width=width, seed=i)
        for i in range(args.turns + 1)
    ]
    model = benchmark_model(args.model_path, work)
    args_ = ["--dtype", "float32", "--enable-streaming-session"]
    with running_server(model, work / "server.log", args_) as server:
        pid = server.process.pid  # the launcher's process: SGLang's tokenizer manager and HTTP server
        session = open_session(server.base_url)
        generate(server.base_url, chat_prompt(VIDEO), 1, video_data=[str(clips[0])], session_params={"id": session},
                 mm_processor_kwargs={"video_pruning_rate": 0.5})  # fmt: skip
        refused_arm(server.base_url, pid, clips[1:4], None)  # warm-up: the processor's first large frames
        outside = refused_arm(server.base_url, pid, clips[1:], None)
        in_session = refused_arm(server.base_url, pid, clips[1:], session)
    result = {"turns": args.turns, "size": args.size, "rss_growth_mb": {"outside": outside, "session": in_session}}
    args.output.write_text(json.dumps(result, indent=1))
    print(
        f"{args.turns} refused {args.size} segments, tokenizer RSS growth: outside a session {outside:.0f} MB, "
        f"as stream turns of a session {in_session:.0f} MB ({(in_session - outside) / args.turns:+.2f} MB a turn)"
    )


if __name__ == "__main__":
    main()
