"""The benchmarks' sample log (`sglang_evs.bench.samples`): every sample written before a run dies, by an error or
a kill, is in its file, and is read back in order; no server."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_evs.bench.samples import SampleLog, read_records, samples_path


def test_samples_written_before_an_error_are_kept_in_order(tmp_path):
    path = tmp_path / "run" / "samples.jsonl"
    with pytest.raises(RuntimeError, match="server died"), SampleLog(path, total=5, desc="rounds") as log:
        log.write({"setup": "s"})  # a record that is no step of the bar
        for i in range(5):
            if i == 3:
                raise RuntimeError("a server died")
            log.sample({"round": i})
    assert read_records([path]) == [{"setup": "s"}, {"round": 0}, {"round": 1}, {"round": 2}]
    assert (log.bar.n, log.bar.total) == (3, 5)


KILLED = """
import os, signal, sys
from sglang_evs.bench.samples import SampleLog

log = SampleLog(sys.argv[1])
for i in range(3):
    log.sample({"round": i})
os.kill(os.getpid(), signal.SIGKILL)  # no exit handler, no buffer flushed at exit
"""


def test_samples_written_before_a_kill_are_kept(tmp_path):
    path = tmp_path / "samples.jsonl"
    done = subprocess.run([sys.executable, "-c", KILLED, str(path)], timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert read_records([path]) == [{"round": i} for i in range(3)]


def test_a_run_starts_its_file_empty_and_a_line_cut_off_is_left_out(tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text('{"from": "an earlier run"}\n')
    SampleLog(first).write({"round": 0})
    with first.open("a") as out:
        out.write('{"round": 1, "ttft')  # the kill came in the middle of a write
    SampleLog(second).write({"round": 2})
    assert read_records([first, second]) == [{"round": 0}, {"round": 2}]


def test_samples_go_beside_the_json_output_or_into_the_workdir(tmp_path):
    assert samples_path(Path("out/r.json"), tmp_path) == Path("out/r.jsonl")
    assert samples_path(None, tmp_path) == tmp_path / "samples.jsonl"
    with pytest.raises(ValueError, match="its own samples"):
        samples_path(Path("r.jsonl"), tmp_path)
