"""The speculation-and-pruning benchmark, run end to end on the tiny Qwen3.5 with its MTP head."""

import pytest

from conftest import load_benchmark


@pytest.mark.slow  # two servers
def test_it_measures_four_configurations_side_by_side(tiny_qwen3_5_mtp_dir, tmp_path, capsys):
    bench = load_benchmark("bench_speculative")
    result = bench.main(["--model-path", str(tiny_qwen3_5_mtp_dir), "--rounds", "3", "--tokens", "8",
                         "--workdir", str(tmp_path)])  # fmt: skip
    configs = result["configs"]
    assert list(configs) == ["neither", "pruning", "MTP", "MTP + pruning"]
    # pruning shortens the prompt, speculation does not; only the speculating server reports acceptance
    assert configs["pruning"]["prompt_tokens"] == configs["MTP + pruning"]["prompt_tokens"]
    assert configs["pruning"]["prompt_tokens"] < configs["neither"]["prompt_tokens"] == configs["MTP"]["prompt_tokens"]
    assert configs["neither"]["mean_accept_length"] is None and configs["pruning"]["mean_accept_length"] is None
    assert configs["MTP"]["mean_accept_length"] > 1 and configs["MTP + pruning"]["mean_accept_length"] > 1
    for row in configs.values():
        for key in ("ttft_vs_neither", "tpot_vs_neither"):
            assert len(row[key]["per_round"]) == 3
            assert row[key]["low"] <= row[key]["geometric_mean"] <= row[key]["high"]
    assert configs["neither"]["ttft_vs_neither"]["geometric_mean"] == pytest.approx(1.0)
    assert "MTP + pruning" in capsys.readouterr().out
