"""GPU: TTFT of short multimodal prefills with SGLang's prefill CUDA graph vs eager, side by side.

    python benchmark/bench_prefill_graph.py [--model-path M] [--backend breakable|full] [--pairs 30]
        [--output result.json]
    python benchmark/bench_prefill_graph.py --report result.jsonl [--output result.json]   # again, from the samples

Two servers run at once on one GPU (each with part of its memory): one with
`--cuda-graph-backend-prefill BACKEND`, one with `disabled`. Each pair sends the same short
request (one image, or one image and a short video at q = .75) to both, streamed, in
alternating order, and takes the time to the first streamed chunk. It reports the per-pair
eager/graph TTFT ratio: geometric mean and its 95 % interval. The run's setup, then each pair as it is measured,
go to a JSONL beside `--output` (`result.json` -> `result.jsonl`; without it `WORKDIR/samples.jsonl`), so a run
cut short keeps what it measured; the result is computed from that file alone (`--report`).

Both servers run with the radix cache off, so every timed request prefills its whole prompt (with
the cache on, a repeated request extends one token and no graph replays). The graph server traces
SGLang's graph runner (SGLANG_EVS_TRACE): the run stops with an error unless each timed request
replayed a prefill graph. Goal: at least 1.3x on small
prefills. Without --model-path it serves the bundled tiny Qwen3-VL (built offline), where
the language model's launch overhead is what a graph removes.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

from sglang_evs.bench.ratios import geometric_interval
from sglang_evs.bench.samples import SampleLog, read_records, samples_path
from sglang_evs.streamed import ttft_ms

SIDES = ("graph", "eager")


def streamed_ttft_ms(base_url: str, body: dict) -> float:
    """Milliseconds from sending a streamed /generate request to its first chunk."""
    return ttft_ms(f"{base_url}/generate", body)


def request_bodies(media: Path) -> dict[str, dict]:
    from sglang_evs.testing.requests import IMAGE, VIDEO, chat_prompt

    sampling = {"max_new_tokens": 1, "temperature": 0}
    return {
        "image": {"text": chat_prompt(IMAGE), "image_data": [str(media / "image.png")], "sampling_params": sampling},
        "image_video_q75": {
            "text": chat_prompt(IMAGE, VIDEO), "image_data": [str(media / "image2.png")],
            "video_data": [str(media / "moving.mp4")], "sampling_params": sampling,
            "mm_processor_kwargs": {"video_pruning_rate": 0.75},
        },
    }  # fmt: skip


def server_args(backend: str) -> list[str]:
    """The GPU route's flags (Triton attention, no sgl_kernel or flashinfer needed) in bfloat16, what a GPU serves."""
    from sglang_evs.runtime.gpu_route import SERVER_ARGS

    return [*SERVER_ARGS, "--dtype", "bfloat16", "--cuda-graph-backend-prefill", backend,
            "--mem-fraction-static", "0.35", "--cuda-graph-bs-prefill", "64", "128", "256", "512", "1024",
            "--disable-radix-cache"]  # fmt: skip


def graph_replays(trace_path: Path) -> int:
    """Prefill graph replays the graph server has traced so far."""
    from sglang_evs import trace

    return sum(e["phase"] == "prefill" for e in trace.read(trace_path, "graph_replay")) if trace_path.exists() else 0


def timed_on_graph(base_url: str, body: dict, trace_path: Path) -> float:
    """TTFT of one request on the graph server; an error unless it replayed a prefill graph."""
    before = graph_replays(trace_path)
    ttft = streamed_ttft_ms(base_url, body)
    if graph_replays(trace_path) <= before:
        raise RuntimeError(f"a timed request replayed no prefill graph (trace {trace_path}): eager timed as graph")
    return ttft


def measure_pairs(
    servers: dict[str, str], bodies: dict[str, dict], pairs: int, trace_path: Path, log: SampleLog
) -> None:
    """Per request body a warm-up on each server, then `pairs` pairs in alternating order, each a sample of `log`."""
    for case, body in bodies.items():
        for url in servers.values():  # warm-up: first request of a shape, not measured
            streamed_ttft_ms(url, body)
        for i in range(pairs):
            order = SIDES if i % 2 == 0 else SIDES[::-1]
            times = {
                side: timed_on_graph(servers[side], body, trace_path)
                if side == "graph"
                else streamed_ttft_ms(servers[side], body)
                for side in order
            }
            log.sample({"case": case, "pair": i, **times})


def result_of(records: list[dict]) -> dict:
    """A run's JSONL (its setup, then its pairs) -> its result: per request body the eager/graph TTFT ratio."""
    setup, *samples = records
    cases: dict[str, list[dict]] = {}
    for s in samples:
        cases.setdefault(s["case"], []).append({side: s[side] for side in SIDES})
    return {**setup, "cases": {case: case_summary(pairs) for case, pairs in cases.items()}}


def case_summary(pairs: list[dict]) -> dict:
    return {
        "eager_over_graph_ttft": geometric_interval([p["eager"] / p["graph"] for p in pairs]),
        "median_ttft_ms": {side: statistics.median(p[side] for p in pairs) for side in SIDES},
        "pairs": pairs,
    }


def finish(result: dict, output: Path | None) -> dict:
    """Prints each request body's ratio and writes the result to `output` (JSON), where given."""
    from sglang_evs.bench.report import interval_text

    for name, case in result["cases"].items():
        print(f"{name}: eager/graph TTFT {interval_text(case['eager_over_graph_ttft'])}")
    if output:
        output.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--backend", choices=("breakable", "full"), default="breakable")
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--workdir", type=Path, default=Path(".cache/bench/prefill_graph"))
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None, help="only the result of this JSONL's samples")
    args = parser.parse_args(argv)
    if args.report:
        return finish(result_of(read_records([args.report])), args.output)

    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_prefill_graph needs a CUDA GPU: prefill CUDA graphs capture on CUDA only")
    from sglang_evs.bench.launch import serving
    from sglang_evs.testing import media, tiny_model

    args.workdir.mkdir(parents=True, exist_ok=True)
    model = args.model_path or str(tiny_model.build_tiny_qwen3_vl(args.workdir / "tiny-qwen3-vl"))
    media_dir = args.workdir / "media"
    media_dir.mkdir(exist_ok=True)
    media.write_image(media_dir / "image.png", seed=0)
    media.write_image(media_dir / "image2.png", seed=5)
    media.write_clip(media_dir / "moving.mp4", "moving", num_frames=8, fps=4)
    bodies = request_bodies(media_dir)

    trace_path = args.workdir / "graph-trace.jsonl"
    trace_path.unlink(missing_ok=True)
    path = samples_path(args.output, args.workdir)
    with (
        SampleLog(path, len(bodies) * args.pairs, "pairs", "pair") as log,
        serving(
            model, args.workdir / "graph.log", server_args(args.backend), env={"SGLANG_EVS_TRACE": str(trace_path)}
        ) as graph,
        serving(model, args.workdir / "eager.log", server_args("disabled")) as eager,
    ):
        log.write({"backend": args.backend, "model": model})
        measure_pairs({"graph": graph.base_url, "eager": eager.base_url}, bodies, args.pairs, trace_path, log)
    result = finish(result_of(read_records([path])), args.output)
    print(f"samples: {path}")
    return result


if __name__ == "__main__":
    main()
