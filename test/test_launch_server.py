"""`python -m sglang_evs.launch_server` folds its pruning flags into SGLang's model overrides."""

import json
import os

import pytest

from sglang_evs.launch_server import fold_pruning_flags


def overrides(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--json-model-override-args") + 1])


def test_rate_joins_existing_overrides():
    argv = fold_pruning_flags(
        ["--model-path", "m", "--video-pruning-rate", "0.75", "--json-model-override-args", '{"a": 1}']
    )
    assert argv[:2] == ["--model-path", "m"]
    assert overrides(argv) == {"a": 1, "video_pruning_rate": 0.75}


def test_vllm_pair_selects_vidcom2_at_the_rate():
    argv = fold_pruning_flags(
        ["--model-path", "m", "--video-pruning-method", "vidcom2", "--video-pruning-rate", "0.75"]
    )
    assert overrides(argv) == {"video_pruning_method": "vidcom2", "video_pruning_rate": 0.75}


def test_the_limits_fold_in_beside_the_rate():
    argv = fold_pruning_flags(
        ["--model-path", "m", "--video-pruning-rate", "0.5", "--video-token-budget", "300",
         "--video-pruning-min-tokens-per-group", "8"]
    )  # fmt: skip
    assert overrides(argv) == {
        "video_pruning_rate": 0.5,
        "video_token_budget": 300,
        "video_pruning_min_tokens_per_group": 8,
    }


def test_the_image_flags_fold_in_beside_the_video_ones():
    argv = fold_pruning_flags(["--image-pruning-method", "dart", "--image-pruning-rate", "0.5", "--video-pruning-rate",
                               "0.25", "--model-path", "m"])  # fmt: skip
    assert argv[:2] == ["--model-path", "m"] and overrides(argv) == {
        "image_pruning_method": "dart", "image_pruning_rate": 0.5, "video_pruning_rate": 0.25}  # fmt: skip


def test_without_the_flags_nothing_changes():
    assert fold_pruning_flags(["--model-path", "m"]) == ["--model-path", "m"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--video-pruning-rate", "1.2"], "video_pruning_rate must be"),
        (["--video-pruning-method", "fastv"], "video_pruning_method must be one of 'evs', 'vidcom2'"),
        (["--json-model-override-args", '{"video_pruning_method": "VidCom2"}'], "video_pruning_method must be"),
        (["--video-retention-ratio", "0.25"], "video_retention_ratio is no longer read: write video_pruning_method"),
        (["--json-model-override-args", '{"video_retention_ratio": 0.5}'], "video_retention_ratio is no longer"),
        (["--video-pruning-threshold", "0.3", "--video-pruning-rate", "0.5"], "video_pruning_threshold=0.3: name one"),
        (["--video-pruning-threshold", "3"], r"video_pruning_threshold must be a number in \[0, 2\]"),
        (["--video-token-budget", "-5"], "video_token_budget must be a whole number >= 0"),
        (
            ["--json-model-override-args", '{"video_token_budjet": 5}'],
            "unknown video pruning setting 'video_token_budjet'",
        ),
        (["--image-pruning-rate", "1"], r"image_pruning_rate must be a number in \[0, 1\)"),
        (["--image-pruning-method", "fastv"], "image_pruning_method must be one of 'divprune', 'dart'"),
        (["--json-model-override-args", '{"image_pruning_rat": 0.5}'], "unknown image pruning setting"),
    ],
)
def test_invalid_settings_are_refused_naming_them(argv, message):
    with pytest.raises(ValueError, match=message):
        fold_pruning_flags(argv)


@pytest.mark.parametrize(
    ("argv", "env", "binding"),
    [
        (["--device", "cpu", "--tp-size", "2"], {}, "0|1"),
        (["--dp-size", "2"], {"SGLANG_USE_CPU_ENGINE": "1"}, "0|1"),
        (["--device=cpu", "--tp-size", "2"], {"SGLANG_CPU_OMP_THREADS_BIND": "1|0"}, "1|0"),  # the user's wins
        (["--device", "cpu"], {}, None),  # one rank: SGLang's own default
        (["--tp-size", "2"], {}, None),  # a GPU launch
    ],
)
def test_a_multi_rank_cpu_launch_gives_each_rank_its_cores(monkeypatch, argv, env, binding):
    from sglang_evs import launch_server
    from sglang_evs.runtime import rank_binding

    launched = {}
    monkeypatch.setattr(rank_binding.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(launch_server.sys, "argv", ["launch_server", "--model-path", "m", *argv])
    monkeypatch.setattr(launch_server.runpy, "run_module", lambda *a, **k: launched.update(os.environ))
    for key in ("SGLANG_USE_CPU_ENGINE", "SGLANG_CPU_OMP_THREADS_BIND"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    launch_server.main()
    assert launched.get("SGLANG_CPU_OMP_THREADS_BIND") == binding


def test_help_lists_the_pruning_flags_beside_sglangs():
    """`--help` of the launcher: its pruning flags, each with its help, then SGLang's whole help (exit 0)."""
    from sglang_evs.launch_server import FLAG_HELP
    from sglang_evs.testing import warm_start

    done = warm_start.run("sglang_evs.launch_server", ["--help"], dict(os.environ), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    ours, _, sglangs = done.stdout.partition("(python -m sglang.launch_server --help)")
    for setting, text in FLAG_HELP.items():
        assert "--" + setting.replace("_", "-") in ours and text.split()[0] in ours
    assert "--model-path" in sglangs and "--json-model-override-args" in sglangs and "--video-pruning" not in sglangs
