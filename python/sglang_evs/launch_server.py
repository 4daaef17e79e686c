"""`python -m sglang.launch_server` with vLLM's `--video-pruning-method` and `--video-pruning-rate`, and
`--video-token-budget`, `--video-pruning-min-tokens-per-group` and `--video-pruning-threshold` beside them, and
`--image-pruning-method` and `--image-pruning-rate` for images.

    python -m sglang_evs.launch_server --video-pruning-rate 0.75 --model-path Qwen/Qwen3-VL-8B-Instruct ...
    python -m sglang_evs.launch_server --video-pruning-method vidcom2 --video-pruning-rate 0.75 --model-path ...
    python -m sglang_evs.launch_server --video-pruning-rate 0.5 --video-token-budget 2048 \
        --video-pruning-min-tokens-per-group 16 --model-path ...
    python -m sglang_evs.launch_server --image-pruning-rate 0.5 --model-path ...

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
    DEFAULT_METHOD,
    METHODS,
    MIN_TOKENS_PER_GROUP_SETTING,
    PRUNING_METHOD_SETTING,
    PRUNING_RATE_SETTING,
    PRUNING_THRESHOLD_SETTING,
    TOKEN_BUDGET_SETTING,
)
from sglang_evs.methods.images import (
    DEFAULT_IMAGE_METHOD,
    IMAGE_METHODS,
    IMAGE_PRUNING_METHOD_SETTING,
    IMAGE_PRUNING_RATE_SETTING,
)
from sglang_evs.pruning.settings import (
    NO_IMAGE_PRUNING,
    NO_PRUNING,
    RETIRED_SETTING,
    image_pruning_from,
    pruning_from,
)
from sglang_evs.runtime.rank_binding import cpu_rank_environment

FLAG_TYPES = {
    PRUNING_METHOD_SETTING: str,
    PRUNING_RATE_SETTING: float,
    TOKEN_BUDGET_SETTING: int,
    MIN_TOKENS_PER_GROUP_SETTING: int,
    PRUNING_THRESHOLD_SETTING: float,
    IMAGE_PRUNING_METHOD_SETTING: str,
    IMAGE_PRUNING_RATE_SETTING: float,
    RETIRED_SETTING: float,
}
FLAG_HELP = {
    PRUNING_METHOD_SETTING: f"which tokens a video keeps: {' or '.join(METHODS)} (default {DEFAULT_METHOD.name})",
    PRUNING_RATE_SETTING: "q, the share of each video's tokens dropped, in [0, 1) (default 0: served as upstream)",
    TOKEN_BUDGET_SETTING: "N: at most N tokens kept of each video (0: no budget)",
    MIN_TOKENS_PER_GROUP_SETTING: "k: at least k tokens kept in every temporal group (0: no floor)",
    PRUNING_THRESHOLD_SETTING: "t in [0, 2]: keep the first group and every token that changed by more than t "
    "since the previous group (in place of the rate)",
    IMAGE_PRUNING_METHOD_SETTING: f"which tokens an image keeps: {' or '.join(IMAGE_METHODS)} "
    f"(default {DEFAULT_IMAGE_METHOD.name})",
    IMAGE_PRUNING_RATE_SETTING: "q, the share of each image's tokens dropped, in [0, 1) (default 0: served as "
    "upstream)",
}
HELP_FLAGS = ("-h", "--help")


def pruning_flags_help() -> str:
    """The pruning flags' section of the launcher's `--help`, printed before SGLang's own help."""
    parser = argparse.ArgumentParser(
        prog="python -m sglang_evs.launch_server",
        usage="%(prog)s [pruning flags] [SGLang's flags: below]",
        description="SGLang's launch_server with video- and image-token pruning (sglang-evs). Each pruning flag can "
        "also be given in --json-model-override-args, and per request in mm_processor_kwargs.",
        add_help=False,
    )
    group = parser.add_argument_group("video- and image-token pruning (sglang-evs)")
    for setting, text in FLAG_HELP.items():
        group.add_argument("--" + setting.replace("_", "-"), type=FLAG_TYPES[setting], help=text)
    return parser.format_help()


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
    pruning_from(overrides, NO_PRUNING)  # validates every video setting and refuses the retired one
    image_pruning_from(overrides, NO_IMAGE_PRUNING)
    return [*rest, "--json-model-override-args", json.dumps(overrides)] if overrides else rest


def on_cpu_route(argv: list[str], env: Mapping[str, str]) -> bool:
    """Whether the server runs on SGLang's CPU route: its CPU engine, or `--device cpu` as SGLang's parser reads it."""
    return env.get("SGLANG_USE_CPU_ENGINE") == "1" or sglang.server_flags(argv).device == "cpu"


def main() -> None:
    if any(flag in sys.argv[1:] for flag in HELP_FLAGS):
        print(pruning_flags_help())
        print("SGLang's flags (python -m sglang.launch_server --help):\n", flush=True)
    try:
        sys.argv = [sys.argv[0], *fold_pruning_flags(sys.argv[1:])]
    except ValueError as exc:
        sys.exit(f"sglang_evs.launch_server: {exc}")
    if on_cpu_route(sys.argv[1:], os.environ):
        os.environ.update(cpu_rank_environment(sys.argv[1:], os.environ))
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
