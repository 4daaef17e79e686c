"""GPU: memory at the plugin's defaults under load. One server of the Qwen3-VL-8B-shaped model (the TTFT
benchmark's: `testing/qwen3_vl_8b_shape.py`, bfloat16, random weights, the GPU route) at SGLang's default
`--mem-fraction-static` and KV pool, with SGLang's embedding cache off (`SGLANG_VLM_CACHE_SIZE_MB=0`, its profiled
default for Qwen3-VL on large Hopper GPUs) and the plugin's default bound on the encoded videos it holds between
prefill chunks (`SGLANG_EVS_HELD_VIDEO_MB` unset: 3 % of the device, at most 4 GiB, reserved out of the KV budget;
`pruning/holds.py`), is sent 32 distinct 120-s clips at once. Every request must be answered, with no
out-of-memory error in the server's log.

    SGLANG_EVS_GPU_ROUTE=1 python benchmark/bench_gpu_memory.py --budget-s 80 --output memory.json
        [--clips 32] [--seconds 120] [--size 448x448] [--fps 2] [--rate 0.75] [--max-tokens 8] [--model-path M]
    python benchmark/bench_gpu_memory.py --smoke [--model-path TINY]    # CPU, tiny model, 3 clips of 2 s at once

Reported beside each other: the peak of the bytes held (the trace's `video_held` / `video_released` /
`video_not_held` events carry the process's `held_bytes` after each), the bound the plugin reserved (its startup
log line), and the KV pool SGLang sized (its log: `max_total_num_tokens`, the KV cache's size, the memory
fraction it resolved); on a GPU also the device's memory in use at its peak while the requests ran (`nvidia-smi`,
polled: this process opens no CUDA context, which would take memory the server counts on).

`--rate`: the server's default pruning rate (`--json-model-override-args`, as a user deploys it; 0: none). 0.75 by
default: 32 clips of ~23.5k video tokens at q = 0 are 750k prompt tokens, more prefill than one device call has
time for on the GPU route; at q = .75 each keeps ~5.9k. Its tower still encodes every frame, and the plugin holds a
pruned video's kept rows only (about 190 MB with deepstack for a 120-s clip, against ~770 MB unpruned).

`--budget-s`: the server's start and the requests end within it (a request still out then is a failure); SIGINT
stops it the same way. The JSON `--output` is written in every case, then the exit status says whether every
request was answered without an out-of-memory error.

`--smoke`: the tiny Qwen3-VL in float32 on a CPU server with 16-token prefill chunks (so that each video spans
chunks and is held between them), 3 clips of 2 s at 128 x 128 sent at once: every step runs, the figures say
nothing (`test/bench/test_bench_gpu_memory.py`).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import requests

CACHE_OFF = {"SGLANG_VLM_CACHE_SIZE_MB": "0"}
SMOKE_CHUNK = 16  # tokens: a smoke clip's video spans several chunks, so it is held between them
HOLD_EVENTS = ("video_held", "video_released", "video_not_held")
GB = 2**30


class Defaults(NamedTuple):
    clips: int
    seconds: float
    size: str
    fps: int
    max_tokens: int


DEFAULTS = {"gpu": Defaults(32, 120, "448x448", 2, 8), "smoke": Defaults(3, 2, "128x128", 4, 4)}


def gpu_server_args(rate: float, method: str, concurrency: int) -> list[str]:
    """The TTFT benchmark's 8B-shaped server (`bench_gpu_ttft.gpu_server_args`) without what its three servers
    sharing one card need: no `--mem-fraction-static`, no `--max-total-tokens` (SGLang sizes the pool itself);
    decode graphs up to the clips sent at once; the server's default rate as a user sets it."""
    from sglang_evs.bench.launch import rate_args
    from sglang_evs.runtime.gpu_route import SERVER_ARGS

    return [*SERVER_ARGS, "--dtype", "bfloat16", "--load-format", "dummy", "--context-length", "32768",
            "--cuda-graph-max-bs-decode", str(concurrency), "--enable-metrics",
            *rate_args(rate or None, method)]  # fmt: skip


def smoke_server_args(rate: float, method: str) -> list[str]:
    from sglang_evs.bench.launch import rate_args

    return ["--dtype", "float32", "--chunked-prefill-size", str(SMOKE_CHUNK), *rate_args(rate or None, method)]


@contextmanager
def default_hold_bound() -> Iterator[None]:
    """The plugin's default bound in every process started meanwhile: `SGLANG_EVS_HELD_VIDEO_MB` unset (servers
    start with this process's environment), then restored."""
    from sglang_evs.pruning.holds import BOUND_ENV

    saved = os.environ.pop(BOUND_ENV, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[BOUND_ENV] = saved


class DeviceMemory:
    """The device's memory in use (MiB), polled with `nvidia-smi` while it runs: its peak and the total."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s, self.peak_mib, self.total_mib = period_s, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            used_total = nvidia_smi("memory.used,memory.total")
            if used_total:
                used, self.total_mib = (int(v) for v in used_total.split(","))
                self.peak_mib = max(used, self.peak_mib or 0)
            self._stop.wait(self.period_s)

    def __enter__(self) -> "DeviceMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def nvidia_smi(fields: str) -> str | None:
    """The first GPU's `fields` (nvidia-smi's --query-gpu, no units), or None where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", "0"],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def ask(base_url: str, line: dict, timeout: float) -> dict:
    """One dataset line as a chat request: its status, prompt tokens and seconds, or the error it met."""
    body = {"model": "default", "messages": line["messages"], "max_tokens": line["max_tokens"], "temperature": 0}
    start = time.perf_counter()
    try:
        response = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=timeout)
    except requests.RequestException as error:
        return {"status": None, "error": f"{type(error).__name__}: {error}"[:300], "seconds": None}
    seconds = round(time.perf_counter() - start, 2)
    if response.status_code != 200:
        return {"status": response.status_code, "error": response.text[:300], "seconds": seconds}
    return {"status": 200, "prompt_tokens": response.json()["usage"]["prompt_tokens"], "seconds": seconds}


def ask_all(base_url: str, dataset: Path, timeout: float) -> list[dict]:
    """Every line of the dataset at once, one thread each. A stop (SIGINT) returns at once, not when the requests
    still out time out: the server's stop ends them."""
    lines = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]
    pool = ThreadPoolExecutor(len(lines))
    try:
        return list(pool.map(lambda line: ask(base_url, line, timeout), lines))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def holds_summary(events: list[dict]) -> dict:
    """What the plugin held (`pruning/holds.py`'s trace): the peak of any process's held bytes, the videos held,
    not held (by why) and let go to make room, and the tower's encodes."""
    holds = [e for e in events if e["event"] in HOLD_EVENTS]
    return {
        "peak_held_bytes": max((e["held_bytes"] for e in holds), default=0),
        "videos_held": sum(e["event"] == "video_held" for e in holds),
        "not_held": dict(Counter(e["why"] for e in holds if e["event"] == "video_not_held")),
        "evicted": sum(e["event"] == "video_released" and e["why"] == "evicted" for e in holds),
        "encodes": sum(e["event"] == "video_encoded" for e in events),
    }


# SGLang's startup lines (0.5.23): the scheduler's, the KV pool's (its post-capture resize, where it runs, last)
# and the plugin's reservation (`plugin.reserve_held_videos`)
KV_TOKENS = re.compile(r"max_total_num_tokens=(\d+)")
KV_SIZE = re.compile(r"KV [Cc]ache (?:is allocated|allocated)\. dtype: [^,]+, #tokens: (\d+), "
                     r"(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)")  # fmt: skip
MEM_FRACTION = re.compile(r"mem_fraction_static'?(?:=|: )([\d.]+)")  # server_args, printed as a dict
RESERVED = re.compile(r"sglang-evs: reserving ([\d.]+) GB of the KV budget for encoded videos")
OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY", re.IGNORECASE)


def last(pattern: re.Pattern, log: str) -> re.Match | None:
    matches = list(pattern.finditer(log))
    return matches[-1] if matches else None


def server_figures(log: str) -> dict:
    """The KV pool and memory settings a server's log states, and its out-of-memory lines."""
    tokens, size = last(KV_TOKENS, log), last(KV_SIZE, log)
    fraction, reserved = last(MEM_FRACTION, log), last(RESERVED, log)
    kv_gb = None
    if size is not None:
        kv_gb = float(size[4]) if size[4] is not None else float(size[2]) + float(size[3])
    return {
        "kv_tokens": int(tokens[1]) if tokens else (int(size[1]) if size else None),
        "kv_gb": kv_gb,
        "mem_fraction_static": float(fraction[1]) if fraction else None,
        "held_reserved_gb": float(reserved[1]) if reserved else None,
        "out_of_memory_lines": [line[:300] for line in log.splitlines() if OUT_OF_MEMORY.search(line)],
    }


def verdict(result: dict) -> bool:
    """Every request answered, none refused, no out-of-memory line in the server's log."""
    answered = [r for r in result["requests"] if r["status"] == 200]
    return bool(result["requests"]) and len(answered) == result["clips"] and not result["out_of_memory_lines"]


def size_text(nbytes: int) -> str:
    return f"{nbytes} bytes ({nbytes / GB:.3f} GiB)"


def report(result: dict) -> str:
    answered = sum(r["status"] == 200 for r in result["requests"])
    tokens = [r["prompt_tokens"] for r in result["requests"] if r["status"] == 200]
    device = result.get("device_memory_mib") or {}
    lines = [
        f"{result['what']} on {result['device']}, {result['date']}: {result['reason']}",
        f"{answered}/{result['clips']} clips of {result['seconds']:g} s answered at once (q = {result['rate']:g}; "
        f"prompt tokens {min(tokens, default=0)}-{max(tokens, default=0)}), "
        f"{len(result['out_of_memory_lines'])} out-of-memory lines in the server log: "
        f"{'PASS' if result['ok'] else 'FAIL'}",
        f"held at peak {size_text(result['peak_held_bytes'])} (reserved for the holds: "
        f"{result['held_reserved_gb'] if result['held_reserved_gb'] is not None else '-'} GB); "
        f"videos held {result['videos_held']}, not held {result['not_held']}, let go for room {result['evicted']}, "
        f"tower encodes {result['encodes']}",
        f"KV pool {result['kv_tokens']} tokens, {result['kv_gb'] if result['kv_gb'] is not None else '-'} GB "
        f"(mem_fraction_static {result['mem_fraction_static']})",
    ]
    if device.get("peak") is not None:
        lines.append(f"device memory in use at peak: {device['peak']} of {device['total']} MiB")
    lines += [f"server: {line}" for line in result["out_of_memory_lines"][:5]]
    lines += [f"request {i}: {r['status']} {r['error']}" for i, r in enumerate(result["requests"]) if r.get("error")][
        :5
    ]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model, 3 short clips")
    parser.add_argument("--budget-s", type=float, default=None, help="the server's start and the requests, within")
    parser.add_argument("--model-path", default=None, help="default: the 8B-shaped config (--smoke: the tiny model)")
    parser.add_argument("--clips", type=int, help="distinct clips sent at once (default 32)")
    parser.add_argument("--seconds", type=float, help="each clip's length (default 120)")
    parser.add_argument("--size", help="HxW (default 448x448)")
    parser.add_argument("--fps", type=int, help="default 2")
    parser.add_argument("--max-tokens", type=int, help="output tokens per request (default 8)")
    parser.add_argument("--rate", type=float, default=0.75, help="the server's default pruning rate (0: none)")
    parser.add_argument("--method", default="evs")
    parser.add_argument("--workdir", type=Path, default=Path(".cache/bench/gpu_memory"))
    parser.add_argument("--output", type=Path, default=None, help="the result's JSON (default WORKDIR/memory.json)")
    args = parser.parse_args(argv)
    if not 0 <= args.rate < 1:
        parser.error("--rate is in [0, 1)")
    for field, value in DEFAULTS["smoke" if args.smoke else "gpu"]._asdict().items():
        if getattr(args, field) is None:
            setattr(args, field, value)
    return args


def make_clips(args: argparse.Namespace, work: Path) -> Path:
    """The clips (`bench/make_video_dataset.py`, half static), one request each."""
    from sglang_evs.bench.make_video_dataset import make_video_dataset, parse_size

    folder = work / f"clips-{args.seconds:g}s"
    return make_video_dataset(folder, args.clips, seconds=args.seconds, size=parse_size(args.size), fps=args.fps,
                              max_tokens=args.max_tokens, seed=9000)  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    started = time.monotonic()
    device = "CPU (smoke)"
    if not args.smoke:
        device = nvidia_smi("name")
        if device is None:
            sys.exit("bench_gpu_memory needs a CUDA GPU (no nvidia-smi answered; or --smoke for the CPU dry run)")
    from sglang_evs import trace
    from sglang_evs.bench.measure import trace_window
    from sglang_evs.testing import qwen3_vl_8b_shape, tiny_model
    from sglang_evs.testing.gpu import ROUTE_ON
    from sglang_evs.testing.server import Launch, running_servers

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    output = args.output or work / "memory.json"
    trace_file, log = work / "trace.jsonl", work / "server.log"
    trace_file.unlink(missing_ok=True)
    if args.smoke:
        model = args.model_path or str(tiny_model.build_tiny_qwen3_vl(work / "tiny-qwen3-vl"))
        server_args = smoke_server_args(args.rate, args.method)
    else:
        model = args.model_path or str(qwen3_vl_8b_shape.build(work / "qwen3-vl-8b-shape"))
        server_args = gpu_server_args(args.rate, args.method, args.clips)
    env = {trace.ENV: str(trace_file), **CACHE_OFF, **({} if args.smoke else ROUTE_ON)}
    what = "smoke: tiny Qwen3-VL, float32, CPU" if args.smoke else "Qwen3-VL-8B-shaped, bfloat16, dummy"
    result = {"what": what, "device": device, "date": time.strftime("%Y-%m-%d %H:%M"), "clips": args.clips,
              "seconds": args.seconds, "size": args.size, "fps": args.fps, "rate": args.rate, "method": args.method,
              "max_tokens": args.max_tokens, "server_args": server_args, "env": env, "budget_s": args.budget_s,
              "requests": []}  # fmt: skip

    def left() -> float:
        return 3600.0 if args.budget_s is None else args.budget_s - (time.monotonic() - started)

    reason = "done"
    try:
        with ThreadPoolExecutor(1) as pool, default_hold_bound():  # the clips written while the server starts
            clips = pool.submit(make_clips, args, work)
            launch = Launch(model, log, server_args, env, cpu=args.smoke)
            with running_servers(launch, timeout=max(1.0, left())) as (server,):
                result["server_start_s"] = round(time.monotonic() - started, 1)
                dataset = clips.result()
                with DeviceMemory() as memory:
                    sent = time.monotonic()
                    result["requests"] = ask_all(server.base_url, dataset, timeout=max(1.0, left()))
                    result["requests_s"] = round(time.monotonic() - sent, 1)
                result["device_memory_mib"] = {"peak": memory.peak_mib, "total": memory.total_mib}
    except KeyboardInterrupt:  # a time limit (SIGINT): the server is stopped, what was measured is reported
        reason = "interrupted (SIGINT)"
    except Exception as error:  # a server that did not start or died: reported with its log's figures
        reason = f"failed: {type(error).__name__}: {str(error)[:300]}"
    result["reason"] = reason
    result.update(server_figures(log.read_text(errors="replace") if log.exists() else ""))
    result.update(holds_summary(trace_window(trace_file, 0)))
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["ok"] = reason == "done" and verdict(result)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1))
    print(report(result))
    print(f"result: {output}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
