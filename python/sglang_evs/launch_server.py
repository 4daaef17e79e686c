"""`python -m sglang.launch_server` with vLLM's `--video-pruning-method` and `--video-pruning-rate`, and
`--video-token-budget`, `--video-pruning-min-tokens-per-group` and `--video-pruning-threshold` beside them.

    python -m sglang_evs.launch_server --video-pruning-rate 0.75 --model-path Qwen/Qwen3-VL-8B-Instruct ...
    python -m sglang_evs.launch_server --video-pruning-method vidcom2 --video-pruning-rate 0.75 --model-path ...
    python -m sglang_evs.launch_server --video-pruning-rate 0.5 --video-token-budget 2048 \
        --video-pruning-min-tokens-per-group 16 --model-path ...

The flags are folded into SGLang's `--json-model-override-args` (merged with one given there), the
standard way SGLang sets a model-config value in every process; everything else goes to SGLang
unchanged. On the CPU route (`--device cpu` or `SGLANG_USE_CPU_ENGINE=1`) with several ranks it
also gives each rank its cores (`runtime.rank_binding`) unless `SGLANG_CPU_OMP_THREADS_BIND` is set.
"""

import argparse
import json
import os
import runpy
import sys
from collections.abc import Mapping

from sglang_evs import sglang_compat as sglang
from sglang_evs.methods import (
    MIN_TOKENS_PER_GROUP_SETTING,
    PRUNING_METHOD_SETTING,
    PRUNING_RATE_SETTING,
    PRUNING_THRESHOLD_SETTING,
    TOKEN_BUDGET_SETTING,
)
from sglang_evs.pruning.settings import NO_PRUNING, RETIRED_SETTING, pruning_from
from sglang_evs.runtime.rank_binding import cpu_rank_environment

FLAG_TYPES = {
    PRUNING_METHOD_SETTING: str,
    PRUNING_RATE_SETTING: float,
    TOKEN_BUDGET_SETTING: int,
    MIN_TOKENS_PER_GROUP_SETTING: int,
    PRUNING_THRESHOLD_SETTING: float,
    RETIRED_SETTING: float,
}


def fold_pruning_flags(argv: list[str]) -> list[str]:
    """argv with the pruning flags (--video-pruning-method, --video-pruning-rate, --video-token-budget, ...)
    moved into --json-model-override-args.

    Raises ValueError naming the setting when a value is invalid, a key of the settings' namespace in
    --json-model-override-args is none of them, a rate and a threshold are both given, or the retired
    --video-retention-ratio is (with what to write instead).
    """
    parser = argparse.ArgumentParser(add_help=False)
    for setting, kind in FLAG_TYPES.items():
        parser.add_argument("--" + setting.replace("_", "-"), type=kind)
    parser.add_argument("--json-model-override-args", default="{}")
    known, rest = parser.parse_known_args(argv)
    overrides = json.loads(known.json_model_override_args)
    overrides.update({key: value for key in FLAG_TYPES if (value := getattr(known, key)) is not None})
    pruning_from(overrides, NO_PRUNING)  # validates every setting and refuses the retired one
    return [*rest, "--json-model-override-args", json.dumps(overrides)] if overrides else rest


def on_cpu_route(argv: list[str], env: Mapping[str, str]) -> bool:
    """Whether the server runs on SGLang's CPU route: its CPU engine, or `--device cpu` as SGLang's parser reads it."""
    return env.get("SGLANG_USE_CPU_ENGINE") == "1" or sglang.server_flags(argv).device == "cpu"


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
