"""Pruning under prefill/decode disaggregation: the KV bytes the prefill server moves to the decode server per
request, and TTFT through the router, at q = rate against q = 0, side by side in one run.

    python benchmark/bench_pd.py [--model-path M] [--rate 0.75] [--rounds 8] [--frames 64] [--output R.json]
    python benchmark/bench_pd.py --report R.jsonl [--output R.json]    # the result again, from the samples

A PD pair on the CPU route (`testing.server.pd_launches`: Mooncake over TCP) behind sglang-router in PD mode
(`testing.router.running_pd_router`), both servers with the plugin and the radix cache off (every
request's whole prompt crosses, none of it a decode server's cached prefix). Without --model-path it serves
the bundled tiny Qwen3-VL (float32).

Each round takes a clip of its own (distinct seeds, one size) and sends it twice through the router (a video's
cache key folds in its rate, so the vision tower runs for each), at q = 0 and at q = rate (EVS, the request's
own setting in `chat_template_kwargs`, the field the router forwards), in an order that alternates from round
to round: a streamed chat request for one output token, TTFT until the first streamed chunk (the decode
server streams the first token once the KV has arrived). What crossed for that request is read from the prefill
server's trace (`sglang_evs.transfer_trace`: each batch of blocks Mooncake moved, by kind: the prompt's KV,
a hybrid model's linear-attention state, the first token's metadata row). The bytes of a KV page that SGLang's
pool registered (`kv_item_lens`, summed over layers) are checked against the checkpoint's config: K and V of
each full-attention layer, `num_key_value_heads x head_dim` float32 values a token. (SGLang's own
`sglang:kv_transfer_total_mb` histogram would count the same pages, but the harness's PD servers published no
samples on `/metrics` when this was written.)

Reported: per rate the median prompt tokens, TTFT, the prefill server's stage times (its trace: processing,
vision tower, language model) and bytes of each kind; per round the KV bytes ratio
q / 0 against the kept fraction of the prompt (prompt tokens q / 0; a page holds one token on the CPU route),
and whether the pages sent are the pages the prompt fills; the TTFT ratio
q / 0 (geometric mean over rounds with a 95 % interval). The two servers and the router share the
machine's cores.

The run's setup, then each request's sample as it is measured, go to a JSONL beside `--output` (`R.json` ->
`R.jsonl`; without it `WORKDIR/samples.jsonl`), so a run cut short keeps what it measured; the result is computed
from that file alone (`--report`), from the rounds measured at both rates.
"""

import argparse
import json
import statistics
from contextlib import ExitStack
from pathlib import Path

import requests

from sglang_evs.bench.measure import USAGE_FIELDS, stage_times, streamed_chat, trace_size
from sglang_evs.bench.ratios import round_ratio
from sglang_evs.bench.samples import SampleLog, read_records, samples_path

KINDS = ("kv", "state", "metadata", "other")  # transfer_trace's kinds
STAGES = ("processing_ms", "encoder_ms", "language_model_ms")  # the prefill server's, from its trace


def chat_body(clip: Path, rate: float, max_tokens: int = 1) -> dict:
    """A streamed greedy chat request on one video, the rate in `chat_template_kwargs`; usage in the last chunk."""
    from sglang_evs.testing.requests import pruning_setting

    video = {"type": "video_url", "video_url": {"url": f"file://{clip}"}}
    content = [video, {"type": "text", "text": "Describe this."}]
    return {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, **USAGE_FIELDS,
            "chat_template_kwargs": pruning_setting(rate)}  # fmt: skip


def transferred(events: list[dict]) -> dict:
    """`pd_transfer` trace events of one request -> bytes by kind, KV pages, and the bytes of a KV page."""
    out = {f"{kind}_bytes": sum(e["bytes"] for e in events if e["kind"] == kind) for kind in KINDS}
    page_bytes = {e["page_bytes"] for e in events if e["kind"] == "kv"}
    if len(page_bytes) > 1:
        raise RuntimeError(f"KV pages of several sizes in one request: {sorted(page_bytes)}")
    out["page_bytes"] = page_bytes.pop() if page_bytes else None
    out["kv_pages"] = out["kv_bytes"] // out["page_bytes"] if out["page_bytes"] else 0
    out["failed_transfers"] = sum(1 for e in events if e["status"] != 0)
    return out


def config_page_bytes(model_path: str | Path, dtype_bytes: int = 4) -> int:
    """The bytes of one token's KV by the checkpoint's config: K and V of each full-attention layer (a hybrid
    model's linear-attention layers keep a state instead), `num_key_value_heads x head_dim` values each."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    text = config.get("text_config", config)
    layer_types = text.get("layer_types")
    layers = layer_types.count("full_attention") if layer_types else text["num_hidden_layers"]
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return 2 * layers * text["num_key_value_heads"] * head_dim * dtype_bytes


def summarize(samples: list[dict], rate: float, page_size: int = 1, token_bytes: int | None = None) -> dict:
    """Samples (`round`, `rate`, `ttft_ms`, `prompt_tokens` and `transferred`'s figures), both rates of every
    round -> medians per rate, per-round ratios q / 0 of KV bytes, prompt tokens and TTFT, whether the pages
    sent are the pages the prompt fills (`page_size` tokens a page) and whether a page has the bytes of
    `page_size` tokens of `token_bytes` (the config's)."""
    by_rate = {q: sorted((s for s in samples if s["rate"] == q), key=lambda s: s["round"]) for q in (0.0, rate)}
    if [s["round"] for s in by_rate[0.0]] != [s["round"] for s in by_rate[rate]]:
        raise ValueError("every round needs a sample at both rates")
    keys = ("prompt_tokens", "ttft_ms", *STAGES, *(f"{kind}_bytes" for kind in KINDS), "kv_pages")
    medians = {str(q): {k: statistics.median(s[k] for s in rows) for k in keys} for q, rows in by_rate.items()}
    base, pruned = by_rate[0.0], by_rate[rate]
    kv_ratio = [p["kv_bytes"] / b["kv_bytes"] for b, p in zip(base, pruned, strict=True)]
    kept = [p["prompt_tokens"] / b["prompt_tokens"] for b, p in zip(base, pruned, strict=True)]
    return {
        "rate": rate,
        "rounds": len(base),
        "medians": medians,
        "page_size": page_size,
        "page_bytes": sorted({s["page_bytes"] for s in samples}),
        "kv_bytes_ratio_per_round": kv_ratio,
        "kept_prompt_fraction_per_round": kept,
        "kv_bytes_ratio_minus_kept_fraction": max(abs(r - k) for r, k in zip(kv_ratio, kept, strict=True)),
        "kv_pages_fill_the_prompt": all(s["kv_pages"] == -(-s["prompt_tokens"] // page_size) for s in samples),
        "config_token_bytes": token_bytes,
        "page_bytes_match_config": token_bytes is not None
        and all(s["page_bytes"] == page_size * token_bytes for s in samples),
        "ttft_vs_q0": round_ratio([s["ttft_ms"] for s in base], [s["ttft_ms"] for s in pruned]),
        "failed_transfers": sum(s["failed_transfers"] for s in samples),
    }


def measure(base_url: str, trace_path: Path, clip: Path, rate: float) -> dict:
    """One request through the router, and what its prefill server moved for it (nothing else is in flight)."""
    from sglang_evs import trace

    before, since = (len(trace.read(trace_path, "pd_transfer")) if trace_path.exists() else 0), trace_size(trace_path)
    ttft_ms, _, prompt_tokens = streamed_chat(base_url, chat_body(clip, rate))
    events = trace.read(trace_path, "pd_transfer")[before:]  # all written before the decode server's first token
    stages = stage_times(trace_path, since)
    return {"ttft_ms": ttft_ms, "prompt_tokens": prompt_tokens, **{k: stages[k] for k in STAGES}, **transferred(events)}


def model_and_env(model_path: str | None, workdir: Path) -> tuple[str, dict[str, str]]:
    """The checkpoint (default: the bundled tiny Qwen3-VL) and the servers' extra environment: a float32
    hybrid model (Qwen3.5) keeps its convolution state in float32 too, as its tests serve it."""
    from sglang_evs.testing import tiny_model
    from sglang_evs.testing.server import is_hybrid

    model = model_path or str(tiny_model.build_tiny_qwen3_vl(workdir / "tiny-qwen3-vl"))
    return model, ({"SGLANG_MAMBA_CONV_DTYPE": "float32"} if is_hybrid(model) else {})


def result_of(records: list[dict]) -> dict:
    """A run's JSONL (its setup, then its samples) -> its result: the setup, the samples and their summary, over
    the rounds measured at both rates (a run cut short may stop inside a round)."""
    setup, *samples = records
    rates = (0.0, setup["rate"])
    both = set.intersection(*({s["round"] for s in samples if s["rate"] == q} for q in rates))
    samples = [s for s in samples if s["round"] in both]
    return {**setup, "samples": samples,
            **summarize(samples, setup["rate"], setup["page_size"], setup["config_token_bytes"])}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--rate", type=float, default=0.75)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--frames", type=int, default=64, help="frames of each clip (4 fps)")
    parser.add_argument("--server-args", default="", help="more flags for both servers, in one string")
    parser.add_argument("--workdir", type=Path, default=Path(".cache/bench/pd"))
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--report", type=Path, default=None, help="only the result of this JSONL's samples")
    args = parser.parse_args(argv)
    if args.report:
        return finish(result_of(read_records([args.report])), args.output)
    args.workdir = args.workdir.absolute()  # the clips go out as file:// URLs

    from sglang_evs import trace
    from sglang_evs.testing import media
    from sglang_evs.testing.router import running_pd_router
    from sglang_evs.testing.server import pd_decode_launch, pd_launches, running_servers

    args.workdir.mkdir(parents=True, exist_ok=True)
    model, env = model_and_env(args.model_path, args.workdir)
    clips = [media.write_clip(args.workdir / f"clip{i}.mp4", "moving", num_frames=args.frames, fps=4, seed=300 + i)
             for i in range(args.rounds + 1)]  # fmt: skip
    trace_path = args.workdir / "prefill-trace.jsonl"
    trace_path.unlink(missing_ok=True)
    server_args = ["--dtype", "float32", "--disable-radix-cache", *args.server_args.split()]
    pd = pd_launches(model, args.workdir, server_args, {**env, trace.ENV: str(trace_path), trace.TRANSFERS_ENV: "1"})
    pd = pd._replace(decode=pd_decode_launch(model, args.workdir / "decode.log", server_args, env))  # untraced

    path = samples_path(args.output, args.workdir)
    with ExitStack() as stack:
        log = stack.enter_context(SampleLog(path, 2 * args.rounds, "PD requests", "request"))
        prefill, decode = stack.enter_context(running_servers(pd.prefill, pd.decode))
        router = stack.enter_context(running_pd_router(prefill, decode, pd.bootstrap_port, args.workdir / "router.log"))
        page_size = int(requests.get(f"{prefill.base_url}/get_server_info", timeout=30).json()["page_size"])
        log.write({"model": model, "frames": args.frames, "server_args": server_args, "rate": args.rate,
                   "page_size": page_size, "config_token_bytes": config_page_bytes(model)})  # fmt: skip
        for rate in (0.0, args.rate):  # warm-up on a clip of its own, not measured
            measure(router.base_url, trace_path, clips[-1], rate)
        for i in range(args.rounds):
            for rate in (0.0, args.rate) if i % 2 == 0 else (args.rate, 0.0):
                log.sample({"round": i, "rate": rate, **measure(router.base_url, trace_path, clips[i], rate)})
    result = finish(result_of(read_records([path])), args.output)
    print(f"samples: {path}")
    return result


def finish(result: dict, output: Path | None) -> dict:
    """Prints the result's report and writes it to `output` (JSON), where given."""
    report(result)
    if output:
        output.write_text(json.dumps(result, indent=2) + "\n")
    return result


def report(result: dict) -> None:
    rate = result["rate"]
    print(f"{result['rounds']} rounds, {result['frames']}-frame clips, q = {rate} against q = 0, {result['model']}")
    for q, row in result["medians"].items():
        print(f"q = {q:5s} prompt {row['prompt_tokens']:6.0f} tokens  TTFT {row['ttft_ms']:8.1f} ms (prefill server: "
              f"processing {row['processing_ms']:.0f}, vision {row['encoder_ms']:.0f}, language model "
              f"{row['language_model_ms']:.0f} ms)  "
              f"KV {row['kv_bytes']:11.0f} B ({row['kv_pages']:.0f} pages)  state {row['state_bytes']:.0f} B  "
              f"metadata {row['metadata_bytes']:.0f} B  other {row['other_bytes']:.0f} B")  # fmt: skip
    kv = statistics.median(result["kv_bytes_ratio_per_round"])
    kept = statistics.median(result["kept_prompt_fraction_per_round"])
    ttft = result["ttft_vs_q0"]
    interval = "" if ttft["low"] is None else f" (95 % interval {ttft['low']:.3f}-{ttft['high']:.3f})"
    print(f"KV bytes q/0: {kv:.4f}, kept fraction of the prompt: {kept:.4f} "
          f"(largest per-round difference {result['kv_bytes_ratio_minus_kept_fraction']:.2e})")  # fmt: skip
    print(f"TTFT q/0 through the router: {ttft['geometric_mean']:.3f}{interval}")
    print(f"KV pages = the pages the prompt fills ({result['page_size']} tokens a page): "
          f"{result['kv_pages_fill_the_prompt']}; a page's bytes = the config's ({result['config_token_bytes']} a "
          f"token): {result['page_bytes_match_config']}; failed transfers: {result['failed_transfers']}")  # fmt: skip


if __name__ == "__main__":
    main()
