"""Pruning on the encoder server: TTFT and bytes sent, encoder/language pair vs one server, q = 0 vs q.

    python benchmark/bench_encoder_disaggregation.py [--model-path M] [--rate 0.75] [--rounds 12]
        [--frames 64] [--device cuda] [--output result.json]

Three servers on one checkpoint: one plugin server, and a pair (an `--encoder-only` server encoding for a
`--language-only` one). Each round sends the same video request four ways, in an order that rotates from
round to round: one server and the pair, at q = 0 and at q = rate (EVS, the request's own setting);
streamed /generate, one output token, radix cache off. TTFT: until the first streamed chunk. The encoder
traces what it sends (`SGLANG_EVS_TRACE`): the bytes of rows and of metadata per request. It reports each
configuration's median TTFT, each one's per-round ratio to one server at q = 0 (geometric mean, 95 %
interval), and the median bytes the encoder sent at q = 0 and at q.

Without --model-path it serves the bundled tiny Qwen3-VL (CPU route; the three servers share the cores,
so the pair's figures include the encoder and the language server competing for them).
"""

import argparse
import json
import statistics
from pathlib import Path

from sglang_evs.bench.ratios import round_ratio
from sglang_evs.streamed import ttft_ms

CONFIGS = {  # name -> (server, rate); None: --rate
    "one server, q=0": ("single", 0.0),
    "one server, q": ("single", None),
    "pair, q=0": ("pair", 0.0),
    "pair, q": ("pair", None),
}


def streamed_ttft_ms(base_url: str, body: dict) -> float:
    return ttft_ms(f"{base_url}/generate", body)


def body(clip: Path, rate: float) -> dict:
    from sglang_evs.testing.requests import VIDEO, chat_prompt, per_request_rate

    return {"text": chat_prompt(VIDEO), "video_data": [str(clip)], **per_request_rate(rate),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--rate", type=float, default=0.75)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workdir", type=Path, default=Path(".cache/bench/encoder_disaggregation"))
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)

    from sglang_evs import trace
    from sglang_evs.bench.launch import serving
    from sglang_evs.testing import media, tiny_model

    args.workdir.mkdir(parents=True, exist_ok=True)
    model = args.model_path or str(tiny_model.build_tiny_qwen3_vl(args.workdir / "tiny-qwen3-vl"))
    clip = media.write_clip(args.workdir / "clip.mp4", "moving", num_frames=args.frames, fps=4, seed=5)
    common = ["--disable-radix-cache", *([] if args.device == "cpu" else ["--device", args.device])]
    encoder_trace = args.workdir / "encoder-trace.jsonl"
    encoder_trace.unlink(missing_ok=True)

    samples: dict[str, list[float]] = {name: [] for name in CONFIGS}
    sent: dict[float, list[int]] = {0.0: [], args.rate: []}
    with (
        serving(model, args.workdir / "single.log", common) as single,
        serving(
            model, args.workdir / "encoder.log", [*common, "--encoder-only"], {trace.ENV: str(encoder_trace)}
        ) as encoder,  # fmt: skip
        serving(
            model, args.workdir / "language.log", [*common, "--language-only", "--encoder-urls", encoder.base_url]
        ) as language,  # fmt: skip
    ):
        servers = {"single": single.base_url, "pair": language.base_url}
        names = list(CONFIGS)
        for name in names:  # warm-up, not measured
            where, rate = CONFIGS[name]
            streamed_ttft_ms(servers[where], body(clip, args.rate if rate is None else rate))
        for i in range(args.rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                where, rate = CONFIGS[name]
                rate = args.rate if rate is None else rate
                before = len(trace.read(encoder_trace, "encoder_sent")) if encoder_trace.exists() else 0
                samples[name].append(streamed_ttft_ms(servers[where], body(clip, rate)))
                if where == "pair":
                    events = trace.read(encoder_trace, "encoder_sent")[before:]
                    sent[rate].append(sum(e["embedding_bytes"] + e["metadata_bytes"] for e in events))

    baseline = samples["one server, q=0"]
    result: dict = {"model": model, "rate": args.rate, "rounds": args.rounds, "frames": args.frames, "configs": {},
                    "bytes_sent": {str(q): statistics.median(b) for q, b in sent.items()}}  # fmt: skip
    for name, times in samples.items():
        result["configs"][name] = {
            "median_ttft_ms": statistics.median(times),
            "vs_one_server_q0": round_ratio(baseline, times),
        }
    result["bytes_ratio"] = result["bytes_sent"][str(args.rate)] / result["bytes_sent"]["0.0"]
    print(f"{args.rounds} rounds, {args.frames}-frame clip, q = {args.rate}, {model}")
    for name, row in result["configs"].items():
        ratio = row["vs_one_server_q0"]
        interval = "" if ratio["low"] is None else f" ({ratio['low']:.2f}-{ratio['high']:.2f})"
        print(f"{name:18s} TTFT {row['median_ttft_ms']:8.1f} ms  {ratio['geometric_mean']:.2f}x{interval}")
    print(f"bytes the encoder sent per request: q=0 {result['bytes_sent']['0.0']:.0f}, "
          f"q={args.rate} {result['bytes_sent'][str(args.rate)]:.0f} ({result['bytes_ratio']:.4f}x)")  # fmt: skip
    if args.output:
        args.output.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
