"""`python -m sglang_evs.launch_server --video-pruning-rate q` folds q into SGLang's model overrides."""

import json

import pytest

from sglang_evs.launch_server import fold_pruning_rate


def test_rate_joins_existing_overrides():
    argv = fold_pruning_rate(
        ["--model-path", "m", "--video-pruning-rate", "0.75", "--json-model-override-args", '{"a": 1}']
    )
    assert argv[:2] == ["--model-path", "m"]
    assert json.loads(argv[argv.index("--json-model-override-args") + 1]) == {"a": 1, "video_pruning_rate": 0.75}


def test_without_the_flag_nothing_changes():
    assert fold_pruning_rate(["--model-path", "m"]) == ["--model-path", "m"]


def test_invalid_rate_names_the_setting():
    with pytest.raises(ValueError, match="video_pruning_rate"):
        fold_pruning_rate(["--video-pruning-rate", "1.2"])
