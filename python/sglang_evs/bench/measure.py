"""Measurements against a running server: SGLang's bench_serving runs (`python -m sglang.benchmark.serving`), timed
requests, text prefills, and what the plugin's trace says a request cost."""

import collections
import contextlib
import io
import json
import random
import re
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import requests

from sglang_evs import sglang_compat as sglang
from sglang_evs.bench.ratios import summarize_bench
from sglang_evs.streamed import streamed_chunks
from sglang_evs.testing.requests import per_request_rate

DEFAULT_RATES = (0.0, 0.25, 0.5, 0.75, 0.9)
TEXT_TOKEN_RANGE = (10, 300)  # ordinary (non-special) token ids in the tiny tokenizer and in Qwen's
IMAGE_ARGS = ("--dataset-name", "image", "--image-count", "1", "--random-input-len", "16",
              "--random-output-len", "4")  # fmt: skip
USAGE_FIELDS = {"stream_options": {"include_usage": True}}


def run_bench_serving(
    base_url: str,
    out_file: Path,
    dataset_args: Sequence[str],
    num_prompts: int,
    max_concurrency: int | None = 1,
    extra_args: Sequence[str] = (),
) -> dict:
    """Run SGLang's bench_serving command line (``python -m sglang.benchmark.serving ...``, in this process: see
    `bench_serving`) and return its output record; what it printed goes to ``out_file`` with ``.log``.

    Its own warm-up is off: it would send the first dataset request, whose media would then be cached
    when that request is measured; call :func:`warm_up` (other media) first instead.
    """
    out_file.unlink(missing_ok=True)
    argv = ["--backend", "sglang-oai-chat", "--base-url", base_url, "--num-prompts", str(num_prompts),
            *dataset_args, "--output-file", str(out_file), "--output-details", "--warmup-requests", "0",
            "--flush-cache", "--seed", "0", *extra_args]  # fmt: skip
    if max_concurrency:
        argv += ["--max-concurrency", str(max_concurrency)]
    status, printed = bench_serving(argv)
    out_file.with_suffix(".log").write_text(printed)
    if status != 0 or not out_file.exists():
        raise RuntimeError(f"bench_serving failed ({status}):\n{printed[-3000:]}")
    record = json.loads(out_file.read_text().splitlines()[-1])
    if record["completed"] < num_prompts:
        raise RuntimeError(f"bench_serving: {record['completed']}/{num_prompts} completed: {record['errors']}")
    return record


def bench_serving(argv: Sequence[str]) -> tuple[int, str]:
    """SGLang's bench_serving command line with `argv`, run in this process: its exit status and what it printed.
    In-process because importing it costs each run about 7 s of CPU (SGLang's package import), more than a
    short run takes; its requests, its client and the record it writes are the command's."""
    cli_main = sglang.resolve("bench_serving_cli")
    printed, saved_argv = io.StringIO(), sys.argv
    sys.argv = ["sglang.benchmark.serving", *argv]
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            cli_main()
        status = 0
    except SystemExit as exit_:  # argparse's usage errors, and anything that exits as the command would
        status = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except Exception:  # noqa: BLE001 - reported as the command's failure, with its traceback
        printed.write(traceback.format_exc())
        status = 1
    finally:
        sys.argv = saved_argv
    return status, printed.getvalue()


def video_bench(
    base_url: str, dataset: Path, out_file: Path, num_prompts: int, concurrency: int = 1, body: dict | None = None
) -> dict:
    """bench_serving on a make_video_dataset JSONL (``body``: extra request fields) -> summarize_bench figures."""
    args = ("--dataset-name", "openai", "--dataset-path", str(dataset))
    extra = ("--extra-request-body", json.dumps(body)) if body else ()
    return summarize_bench(run_bench_serving(base_url, out_file, args, num_prompts, concurrency, extra))


def image_bench(
    base_url: str, out_file: Path, num_prompts: int, body: dict | None = None, resolution: str = "64x64"
) -> dict:
    """bench_serving on its generated ``image`` dataset (one image of ``resolution`` per request, one at a time)."""
    extra = ("--extra-request-body", json.dumps({**USAGE_FIELDS, **(body or {})}))
    args = (*IMAGE_ARGS, "--image-resolution", resolution)
    return summarize_bench(run_bench_serving(base_url, out_file, args, num_prompts, 1, extra))


def warm_up(base_url: str, out_dir: Path, dataset: Path) -> None:
    """One video and one image chat request with media in no measured request.

    The video is the dataset's ``warmup.mp4`` (same shape as its clips, see make_video_dataset) when
    there is one: the first prefill of a new size is slow on CPU, and it must not be a measured one.
    """
    from sglang_evs.bench.make_video_dataset import WARMUP_CLIP
    from sglang_evs.testing import media

    clip, image = dataset.parent / WARMUP_CLIP, out_dir / "warmup.png"
    if not clip.exists():
        clip = media.write_clip(out_dir / WARMUP_CLIP, "moving", seed=999)
    if not image.exists():
        media.write_image(image, seed=999)
    for kind, path in (("video_url", clip), ("image_url", image)):
        content = [{"type": kind, kind: {"url": f"file://{path.resolve()}"}}, {"type": "text", "text": "Hi"}]
        body = {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
        requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=600).raise_for_status()


class TimedRequest(NamedTuple):
    ttft_ms: float  # streamed: until the first chunk with a choice, which SGLang sends with the first token
    latency_ms: float  # until the stream ends
    prompt_tokens: int


def timed_video_request(base_url: str, line: dict, rate: float, method: str = "evs") -> TimedRequest:
    """One dataset line at ``rate``, one output token, streamed with usage -> TTFT, latency, prompt tokens."""
    body = {"model": "default", "messages": line["messages"], "max_tokens": 1, "temperature": 0, "stream": True,
            **USAGE_FIELDS, **per_request_rate(rate, method)}  # fmt: skip
    return streamed_chat(base_url, body)


def streamed_chat(base_url: str, body: dict, timeout: float = 600) -> TimedRequest:
    """A streamed chat request (`body` asks for usage, `USAGE_FIELDS`) -> TTFT until the first chunk that
    carries a choice, latency until the stream ends, prompt tokens from the usage chunk."""
    ttft_ms, prompt_tokens, seconds = None, None, 0.0
    for seconds, chunk in streamed_chunks(f"{base_url}/v1/chat/completions", body, timeout):
        if ttft_ms is None and chunk.get("choices"):
            ttft_ms = seconds * 1000
        if chunk.get("usage"):
            prompt_tokens = chunk["usage"]["prompt_tokens"]
    if ttft_ms is None or prompt_tokens is None:
        raise RuntimeError(f"stream from {base_url} ended without a token or usage (ttft {ttft_ms}, {prompt_tokens})")
    return TimedRequest(ttft_ms, seconds * 1000, prompt_tokens)


class MetaReply(NamedTuple):
    ttft_ms: float  # until the reply arrived: one output token, so its first
    prompt_tokens: int
    meta: dict  # SGLang's meta_info: its per-request time stats where the server runs with --enable-metrics


def meta_reply(base_url: str, line: dict, fields: dict | None = None) -> MetaReply:
    """One dataset line answered with one output token, not streamed, with SGLang's `meta_info` (which it sends
    only unstreamed). `fields`: more request fields (a per-request pruning setting); none: the server's default."""
    body = {"model": "default", "messages": line["messages"], "max_tokens": 1, "temperature": 0,
            "return_meta_info": True, **(fields or {})}  # fmt: skip
    start = time.perf_counter()
    response = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=600)
    took_ms = (time.perf_counter() - start) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"{base_url} answered {response.status_code}: {response.text[:500]}")
    reply = response.json()
    return MetaReply(took_ms, reply["usage"]["prompt_tokens"], reply["choices"][0].get("meta_info") or {})


def sglang_processing_ms(meta: dict) -> float | None:
    """SGLang's own time for a request's tokenizer side, from its per-request time stats (`--enable-metrics`):
    received until handed to the scheduler (media loaded and processed, prompt tokenized); None without them."""
    received, handed = meta.get("request_received_ts"), meta.get("api_server_dispatch_finish_ts")
    return None if received is None or handed is None else (handed - received) * 1000


def prefill_ms(base_url: str, num_tokens: int, reps: int = 3, seed: int = 0) -> float:
    """Median latency (ms) of ``/generate`` on ``num_tokens`` random text ids with one output token.

    Fresh random ids per call (no prefix-cache hits); one unmeasured warm-up call first.
    """
    rng = random.Random(seed)
    times = []
    for i in range(reps + 1):
        ids = [rng.randrange(*TEXT_TOKEN_RANGE) for _ in range(num_tokens)]
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        start = time.perf_counter()
        response = requests.post(f"{base_url}/generate", json=body, timeout=600)
        response.raise_for_status()
        if i:
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def text_only_tokens(base_url: str, dataset: Path) -> int:
    """Server-reported prompt tokens of the dataset's first request with its video part removed."""
    line = json.loads(dataset.read_text().splitlines()[0])
    message = line["messages"][0]
    text = [p for p in message["content"] if p.get("type") == "text"]
    body = {"model": "default", "messages": [{**message, "content": text}], "max_tokens": 1}
    response = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()["usage"]["prompt_tokens"]


def plugin_loaded(log: str) -> bool:
    """Whether a server log has the plugin's announcement line (``sglang-evs <version> plugin loaded (...)``)."""
    return re.search(r"sglang-evs \S+ plugin loaded \(", log) is not None


STAGE_EVENTS = {"processed": "processing_ms", "video_encoded": "encoder_ms", "mask_and_fill": "mask_fill_ms",
                "extend_forward": "forward_ms"}  # fmt: skip


def trace_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def trace_window(path: Path, since: int) -> list[dict]:
    """The events the server traced after byte ``since`` (`trace_size` before the work it is to show)."""
    if trace_size(path) <= since:
        return []
    with path.open() as lines:
        lines.seek(since)
        return [json.loads(line) for line in lines if line.strip()]


def stage_times(path: Path, since: int) -> dict:
    """Per-stage milliseconds of what the server traced after byte ``since`` (one request's window):
    tokenizer-side processing, vision encoder, keep-mask and region fill, the extend forwards
    (encoder included), and the language model's share, forwards minus encoder and mask."""
    stages = dict.fromkeys(STAGE_EVENTS.values(), 0.0)
    for event in trace_window(path, since):
        if event["event"] in STAGE_EVENTS:
            stages[STAGE_EVENTS[event["event"]]] += event["ms"]
    stages["language_model_ms"] = stages["forward_ms"] - stages["encoder_ms"] - stages["mask_fill_ms"]
    return stages


def request_encodes(events: list[dict]) -> tuple[int, float]:
    """How many times the vision tower ran for the one request of a trace window, and its milliseconds: the
    `video_encoded` events naming one of the videos its `processed` event names. Where the tokenizer had not
    hashed them (SGLang hashes an item where it chooses: in the scheduler where the pixels are a CUDA IPC handle)
    every encode of the window counts: callers send one request at a time."""
    named = {h for e in events if e["event"] == "processed" for h in e["items"] if h is not None}
    encoded = [e for e in events if e["event"] == "video_encoded" and (not named or named & set(e["items"]))]
    return len(encoded), sum(e["ms"] for e in encoded)


def encodes_per_video(events: list[dict]) -> dict[str, int]:
    """How many times the vision tower ran on each video (by hash) in a trace window of many requests: more than
    once where a later prefill chunk of its request encoded it again."""
    return dict(collections.Counter(h for e in events if e["event"] == "video_encoded" for h in e["items"]))
