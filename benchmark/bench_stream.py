"""A live stream served turn by turn: per-segment TTFT and kept tokens, unpruned beside pruned, on one server.

    python benchmark/bench_stream.py [--model-path M] [--segments 12] [--segment-s 2] [--fps 4] [--size 448x448]
        [--rate 0.75] [--threshold 0.3] [--output r.json]
    python benchmark/bench_stream.py --gpu [--model-path M] ...    # on a GPU: the 8B-shaped Qwen3-VL, bfloat16
    python benchmark/bench_stream.py --report r.jsonl

One server with streaming sessions: on the CPU the tiny Qwen3-VL in float32; with `--gpu` the Qwen3-VL-8B-shaped
model of random weights in bfloat16 on the GPU route, as `bench_gpu_ttft.py` serves it (`scripts/gpu_run.sh`'s
`stream` step). A long clip (a moving square over a still scene, as a
fixed camera sees it) is cut into `--segment-s` segments; one streaming session per setting (q = 0, q = `--rate`,
`--threshold`) is sent the stream a segment per turn, each turn marked `video_stream` after the first and asking a
question about it (the short reply stays in the session's history, as a user's would). The sessions advance in
lockstep, their order rotated from segment to segment, so that each segment's three turns are measured side by side.
Per turn: the time to its first token (streamed), the video tokens the turn prefilled before and after pruning, and
its cached tokens (the radix cache reusing the history). Printed: per setting, the median TTFT and the kept tokens
per segment; TTFT(setting) / TTFT(q = 0) per segment, its geometric mean and 95 % interval. Every turn is appended to
`r.jsonl` as it is measured; `--report` recomputes the summary from it alone.
"""

import argparse
import json
import statistics
from pathlib import Path

from sglang_evs.bench.ratios import round_ratio
from sglang_evs.bench.samples import SampleLog, read_records, samples_path
from sglang_evs.streamed import streamed_chunks
from sglang_evs.testing import media
from sglang_evs.testing.requests import VIDEO, chat_prompt, close_session, open_session
from sglang_evs.testing.server import Launch, running_servers
from sglang_evs.testing.tiny_model import build_tiny_model

CPU_ARGS = ["--dtype", "float32", "--enable-streaming-session"]
QUESTION = "What changed in these two seconds?"
REPLY_TOKENS = 8


def settings_of(rate: float, threshold: float) -> dict[str, dict]:
    return {"q=0": {"video_pruning_rate": 0.0}, f"q={rate:g}": {"video_pruning_rate": rate},
            f"t={threshold:g}": {"video_pruning_threshold": threshold}}  # fmt: skip


def stream_turn(base_url: str, session: str, segment: Path, settings: dict, continues: bool) -> dict:
    """One segment and its question appended to `session`, streamed: TTFT, and the turn's counts from its last
    chunk's meta info."""
    body = {"text": chat_prompt(VIDEO, text=QUESTION), "video_data": [str(segment)], "stream": True,
            "session_params": {"id": session},
            "mm_processor_kwargs": {**settings, "video_stream": True} if continues else settings,
            "sampling_params": {"max_new_tokens": REPLY_TOKENS, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    ttft_ms, meta = None, None
    for seconds, chunk in streamed_chunks(f"{base_url}/generate", body):
        if ttft_ms is None and chunk.get("output_ids"):
            ttft_ms = seconds * 1000
        meta = chunk.get("meta_info", meta)
    if ttft_ms is None or meta is None:
        raise RuntimeError("the turn streamed no token")
    # q = 0 prunes nothing, so its meta info carries no counts: filled in from the segment's other turns (`summarize`)
    return {"ttft_ms": ttft_ms, "before": meta.get("video_tokens_before_pruning"),
            "kept": meta.get("video_tokens_after_pruning"), "prompt_tokens": meta["prompt_tokens"],
            "cached_tokens": meta.get("cached_tokens", 0)}  # fmt: skip


def gpu_launch(model: Path, work: Path) -> Launch:
    """The server on the GPU route, as `bench_gpu_ttft.py` serves the 8B-shaped model, with streaming sessions."""
    from bench_gpu_ttft import gpu_server_args

    from sglang_evs.testing.gpu import ROUTE_ON

    args = [*gpu_server_args(max_concurrency=1), "--enable-streaming-session"]
    return Launch(model, work / "server.log", args, ROUTE_ON, cpu=False)


def summarize(records: list[dict]) -> dict:
    """The run's summary from its samples alone (the first turn of each session is the warm-up of its stream and is
    reported apart: it has no history and keeps its first group whole)."""
    names = list(dict.fromkeys(record["setting"] for record in records))
    before = {r["segment"]: r["before"] for r in records if r["before"] is not None}
    records = [{**r, "before": before[r["segment"]], "kept": before[r["segment"]]} if r["kept"] is None else r
               for r in records]  # fmt: skip
    by = {name: sorted((r for r in records if r["setting"] == name), key=lambda r: r["segment"]) for name in names}
    segments = sorted({r["segment"] for r in records if r["segment"] > 0} & set.intersection(
        *({r["segment"] for r in rows} for rows in by.values())))  # fmt: skip
    baseline, out = names[0], {"settings": {}}
    for name, rows in by.items():
        later = [r for r in rows if r["segment"] in segments]
        out["settings"][name] = {
            "median_ttft_ms": statistics.median(r["ttft_ms"] for r in later),
            "kept_per_segment": statistics.fmean(r["kept"] for r in later),
            "before_per_segment": statistics.fmean(r["before"] for r in later),
            "first_segment_kept": rows[0]["kept"],
            "min_cached_fraction": min(r["cached_tokens"] / r["prompt_tokens"] for r in later),
        }
        if name != baseline:
            ttft = {r["segment"]: r["ttft_ms"] for r in later}
            base = {r["segment"]: r["ttft_ms"] for r in by[baseline] if r["segment"] in segments}
            out["settings"][name]["ttft_ratio"] = round_ratio([base[s] for s in segments], [ttft[s] for s in segments])
    out["segments"] = len(segments)
    return out


def print_summary(summary: dict) -> None:
    for name, row in summary["settings"].items():
        cached = row["min_cached_fraction"]
        line = (f"{name:>8}: median TTFT {row['median_ttft_ms']:7.1f} ms, video tokens per segment "
                f"{row['kept_per_segment']:6.1f} of {row['before_per_segment']:.0f} (first segment "
                f"{row['first_segment_kept']}), history from the radix cache >= {cached:.0%}")  # fmt: skip
        ratio = row.get("ttft_ratio")
        if ratio is not None:
            interval = "" if ratio["low"] is None else f" (95 %: {ratio['low']:.3f}-{ratio['high']:.3f})"
            line += f"; TTFT / TTFT(q=0) over {ratio['pairs']} segments {ratio['geometric_mean']:.3f}{interval}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None, help="default: the tiny Qwen3-VL (--gpu: the 8B-shaped one)")
    parser.add_argument("--gpu", action="store_true", help="serve on the GPU (the GPU route), bfloat16")
    parser.add_argument("--segments", type=int, default=12)
    parser.add_argument("--segment-s", type=float, default=2.0)
    parser.add_argument("--fps", type=int, default=4)
    parser.add_argument("--size", default="448x448")
    parser.add_argument("--rate", type=float, default=0.75)
    parser.add_argument("--threshold", type=float, default=0.3)
    parser.add_argument("--output", type=Path, default=Path("bench-stream.json"))
    parser.add_argument("--report", type=Path, default=None, help="a run's .jsonl: its summary, measuring nothing")
    args = parser.parse_args()
    if args.report is not None:
        print_summary(summarize(read_records([args.report])))
        return
    width, height = (int(v) for v in args.size.split("x"))
    work = args.output.resolve().parent / "bench-stream"
    work.mkdir(parents=True, exist_ok=True)
    per_segment = int(args.segment_s * args.fps)
    frames = media.clip_frames("moving", num_frames=per_segment * args.segments, height=height, width=width, seed=5)
    segments = [media.write_mp4(work / f"segment-{i}.mp4", frames[per_segment * i : per_segment * (i + 1)],
                                fps=args.fps) for i in range(args.segments)]  # fmt: skip
    model = Path(args.model_path) if args.model_path else None
    if model is None and args.gpu:
        from sglang_evs.testing import qwen3_vl_8b_shape

        model = qwen3_vl_8b_shape.build(work / "qwen3-vl-8b-shape")
    elif model is None:
        model = work / "qwen3-vl-tiny"
        if not model.exists():
            build_tiny_model(model, profile="tiny")
    settings = settings_of(args.rate, args.threshold)
    launch = gpu_launch(model, work) if args.gpu else Launch(model, work / "server.log", CPU_ARGS)
    with (
        running_servers(launch) as (server,),
        SampleLog(samples_path(args.output, work), total=len(settings) * args.segments, desc="turns") as log,
    ):
        sessions = {name: open_session(server.base_url) for name in settings}
        for index, segment in enumerate(segments):
            order = list(settings)[index % len(settings) :] + list(settings)[: index % len(settings)]
            for name in order:
                measured = stream_turn(server.base_url, sessions[name], segment, settings[name], continues=index > 0)
                log.sample({"setting": name, "segment": index, **measured})
        for session in sessions.values():
            close_session(server.base_url, session)
    summary = summarize(read_records([log.path]))
    args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **summary}, indent=1))
    print_summary(summary)


if __name__ == "__main__":
    main()
