"""`python -m sglang.launch_server` with a `--video-pruning-rate` flag.

    python -m sglang_evs.launch_server --video-pruning-rate 0.75 --model-path Qwen/Qwen3-VL-8B-Instruct ...

The flag is folded into SGLang's `--json-model-override-args` (merged with
one given there), the standard way SGLang sets `video_pruning_rate` on the
model config in every process; everything else goes to SGLang unchanged.
"""

import argparse
import json
import runpy
import sys

from sglang_evs.evs import PRUNING_RATE_SETTING, validate_pruning_rate


def fold_pruning_rate(argv: list[str]) -> list[str]:
    """argv with --video-pruning-rate moved into --json-model-override-args."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--video-pruning-rate", type=float)
    parser.add_argument("--json-model-override-args", default="{}")
    known, rest = parser.parse_known_args(argv)
    overrides = json.loads(known.json_model_override_args)
    if known.video_pruning_rate is not None:
        overrides[PRUNING_RATE_SETTING] = validate_pruning_rate(known.video_pruning_rate)
    return [*rest, "--json-model-override-args", json.dumps(overrides)] if overrides else rest


def main() -> None:
    try:
        sys.argv = [sys.argv[0], *fold_pruning_rate(sys.argv[1:])]
    except ValueError as exc:
        sys.exit(f"--video-pruning-rate: {exc}")
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
