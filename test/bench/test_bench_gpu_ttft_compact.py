"""The TTFT benchmark's compact mode (`bench_gpu_ttft.py --compact`, scripts/gpu_run.sh's default `bench` step):
its plan, and a budget shared between its two parts so that part 2 runs even where part 1 would fill the budget."""

import pytest

from sglang_evs.testing.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_gpu_ttft")


def test_compact_runs_both_parts_on_few_clips(bench):
    args = bench.parse(["--compact"])
    assert args.part == "all" and bench.STEPS[args.part] == ("requests", "load")
    assert (tuple(args.seconds), args.clips, tuple(args.concurrency), args.min_prompts) == ((8, 48), 2, (1, 8), 4)
    assert (args.size, args.fps, args.load_seconds) == ("448x448", 2, 8)  # the full parts' clips, fewer of them
    assert (
        bench.parse(["--compact", "--clips", "3"]).clips == 3 and bench.parse(["--compact", "--part", "2"]).part == "2"
    )
    with pytest.raises(SystemExit):
        bench.parse(["--compact", "--smoke"])


def test_part_one_stops_at_its_share_and_part_two_gets_the_rest(bench, tmp_path):
    now = [0.0]

    def measure():
        now[0] += 2.0  # every sample takes 2 s of the 20 s budget
        return {}

    run = bench.Run(tmp_path / "samples.jsonl", budget_s=20.0, clock=lambda: now[0])

    def part(kind):
        return lambda: [run.sample(kind, measure, step=kind) for _ in range(100)]

    assert run.within(bench.REQUESTS_SHARE, part("requests")) == "requests"  # 5 samples: 10 s, half of 20
    assert run.within(1.0, part("load")) == "load"  # 5 more: the other 10 s
    steps = [r["step"] for r in bench.read_records([tmp_path / "samples.jsonl"])]
    assert steps == ["requests"] * 5 + ["load"] * 5
    assert run.deadline == 20.0  # the run's own deadline, restored after each part
    unbounded = bench.Run(tmp_path / "unbounded.jsonl", budget_s=None)
    assert unbounded.within(0.5, lambda: None) is None and unbounded.deadline is None
