"""Serve the tiny Qwen3-VL with `python -m sglang.launch_server` and prune one video at q = 0.75: the first
end-to-end check of SGLang 0.5.23 with sglang-evs on a machine set up from the carried wheel set.

  python scripts/gpu_pack/serve_check.py --device cuda --work DIR [--report FILE]   (the GPU machine)
  python scripts/gpu_pack/serve_check.py --device cpu --work DIR --model M --clip C  (the CPU rehearsal)

It builds the tiny model with this interpreter (unless --model), writes a clip with OpenCV (unless --clip;
the GPU machine has no PyAV), starts the server (on CUDA with the GPU route's `SERVER_ARGS` where
`sglang_evs.runtime.gpu_route` exists; on CPU with the CPU route's arguments and environment), then asserts:
/generate of the clip at q = 0 and q = 0.75 answers 200, the pruned request keeps fewer video tokens than
it had (`video_tokens_after_pruning` < `video_tokens_before_pruning`) and fewer prompt tokens than the
unpruned one, and an OpenAI chat request with the video at q = 0.75 answers 200. Writes a JSON report.
"""

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import requests

from sglang_evs.testing import media, server
from sglang_evs.testing.requests import VIDEO, chat_prompt, generate, per_request_rate

# Where sglang_evs.runtime.gpu_route does not exist (yet): SGLang's own backends that need no sgl_kernel build.
FALLBACK_GPU_ARGS = ("--attention-backend", "triton", "--sampling-backend", "pytorch", "--mem-fraction-static", "0.5")


def gpu_server_args() -> tuple[tuple[str, ...], str]:
    if importlib.util.find_spec("sglang_evs.runtime.gpu_route") is not None:
        from sglang_evs.runtime import gpu_route

        return tuple(gpu_route.SERVER_ARGS), "sglang_evs.runtime.gpu_route.SERVER_ARGS"
    return FALLBACK_GPU_ARGS, "fallback (no sglang_evs.runtime.gpu_route)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--work", type=Path, required=True, help="folder for the model, clip and server log")
    parser.add_argument("--model", type=Path, help="a tiny checkpoint (default: build one into --work)")
    parser.add_argument("--clip", type=Path, help="an mp4 clip (default: the suite's moving clip written into --work)")
    parser.add_argument("--rate", type=float, default=0.75)
    parser.add_argument("--timeout", type=float, default=300, help="seconds for the server to come up")
    parser.add_argument("--report", type=Path, help="JSON report (default: WORK/serve-check.json)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    report: dict = {"device": args.device, "rate": args.rate, "python": sys.version.split()[0], "ok": False}
    report_path = args.report or args.work / "serve-check.json"
    started = time.monotonic()
    try:
        if args.model is None:
            from sglang_evs.testing import tiny_model

            args.model = args.work / "tiny-qwen3-vl"
            if not (args.model / "config.json").is_file():
                tiny_model.build_tiny_model(args.model)
        # the suite's clip as the GPU tests' fixtures write it there: with OpenCV where PyAV is absent
        clip = args.clip or media.write_clip(args.work / "moving.mp4", "moving", num_frames=8, fps=4)
        report["clip_writer"] = "given" if args.clip else media.video_writer()
        report["setup_s"] = round(time.monotonic() - started, 1)
        if args.device == "cuda":
            extra, report["server_args_from"] = gpu_server_args()
            # a tiny model at SGLang's default memory fraction (0.9) is given a 517M-token KV pool on an H200,
            # and the decode graphs' buffers then find the card full (seen there): a small pool, as the GPU tests'
            extra = (*extra, "--enable-metrics", "--max-total-tokens", "65536", "--mem-fraction-static", "0.3")
        else:
            extra, report["server_args_from"] = ("--dtype", "float32", "--enable-metrics"), "CPU route"
        log = args.work / "server.log"
        report["server_log"] = str(log)
        launched = time.monotonic()
        process = server.start_server(args.model, log, extra, cpu=args.device == "cpu")
        base_url = f"http://127.0.0.1:{process.port}"
        try:
            server.wait_healthy(base_url, process, log, args.timeout)
            report["server_start_s"] = round(time.monotonic() - launched, 1)
            prompt = chat_prompt(VIDEO)
            video = {"video_data": [str(clip)]}
            full, pruned = (generate(base_url, prompt, **video, **per_request_rate(q))[0] for q in (0.0, args.rate))
            before = pruned.meta["video_tokens_before_pruning"]
            kept = pruned.meta["video_tokens_after_pruning"]
            report.update(prompt_tokens_unpruned=full.prompt_tokens, prompt_tokens_pruned=pruned.prompt_tokens,
                          video_tokens_before=before, video_tokens_kept=kept)  # fmt: skip
            assert kept < before, f"q = {args.rate} kept {kept} of {before} video tokens"
            assert pruned.prompt_tokens < full.prompt_tokens, (pruned.prompt_tokens, full.prompt_tokens)
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": [
                    {"type": "video_url", "video_url": {"url": f"file://{Path(clip).resolve()}"}},
                    {"type": "text", "text": "Describe this."},
                ]}],
                "max_tokens": 8, "temperature": 0, **per_request_rate(args.rate, field="chat_template_kwargs"),
            }  # fmt: skip
            chat = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
            report["chat_status"] = chat.status_code
            assert chat.status_code == 200, chat.text[:2000]
            report["chat_prompt_tokens"] = chat.json()["usage"]["prompt_tokens"]
            report["ok"] = True
        finally:
            server.stop(process)
    except Exception as error:  # the report says what failed; the exit status too
        report["error"] = f"{type(error).__name__}: {error}"[:4000]
    report["total_s"] = round(time.monotonic() - started, 1)
    report_path.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
