"""`python -m sglang.launch_server` with `--video-pruning-rate` (EVS) and `--video-retention-ratio` (VidCom2).

    python -m sglang_evs.launch_server --video-pruning-rate 0.75 --model-path Qwen/Qwen3-VL-8B-Instruct ...
    python -m sglang_evs.launch_server --video-retention-ratio 0.25 --model-path Qwen/Qwen3-VL-8B-Instruct ...

The flags (vLLM's names; at most one) are folded into SGLang's `--json-model-override-args`
(merged with one given there), the standard way SGLang sets a model-config value in every
process; everything else goes to SGLang unchanged. On the CPU route (`--device cpu` or
`SGLANG_USE_CPU_ENGINE=1`) with several ranks it also gives each rank its cores
(`runtime.rank_binding`) unless `SGLANG_CPU_OMP_THREADS_BIND` is set.
"""

import argparse
import json
import os
import runpy
import sys
from collections.abc import Mapping

from sglang_evs.evs import METHODS, method_from_settings
from sglang_evs.runtime.rank_binding import cpu_rank_environment


def fold_pruning_flags(argv: list[str]) -> list[str]:
    """argv with --video-pruning-rate / --video-retention-ratio moved into --json-model-override-args.

    Raises ValueError naming the setting(s) when a value is invalid or both methods end up set.
    """
    parser = argparse.ArgumentParser(add_help=False)
    for method in METHODS.values():
        parser.add_argument("--" + method.setting.replace("_", "-"), type=float)
    parser.add_argument("--json-model-override-args", default="{}")
    known, rest = parser.parse_known_args(argv)
    overrides = json.loads(known.json_model_override_args)
    for method in METHODS.values():
        value = getattr(known, method.setting)
        if value is not None:
            overrides[method.setting] = value
    method_from_settings(overrides)  # validates the value and refuses both methods at once
    return [*rest, "--json-model-override-args", json.dumps(overrides)] if overrides else rest


def on_cpu_route(argv: list[str], env: Mapping[str, str]) -> bool:
    devices = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--device"]
    devices += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--device=")]
    return env.get("SGLANG_USE_CPU_ENGINE") == "1" or "cpu" in devices


def main() -> None:
    try:
        sys.argv = [sys.argv[0], *fold_pruning_flags(sys.argv[1:])]
    except ValueError as exc:
        sys.exit(f"sglang_evs.launch_server: {exc}")
    if on_cpu_route(sys.argv[1:], os.environ):
        os.environ.update(cpu_rank_environment(sys.argv[1:], os.environ))
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
