"""The README's main job: one command serves a video with EVS and shows what it saved."""

import os
import re
import subprocess
import sys

import pytest
from PIL import Image

pytestmark = pytest.mark.slow  # the full suite only (see pyproject.toml)


def test_demo_prints_the_table_the_reply_and_the_picture(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sglang_evs.demo", "--pruning-rate", "0.75"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=os.environ,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert not [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("ERROR")]
    # only what the demo is about: SGLang's and transformers' import-time warnings stay in the server log
    assert "Warning" not in done.stderr and "it/s]" not in done.stderr, done.stderr[-2000:]
    table = [re.match(r"(\S+)\s+(\d+)\s+(\d+)$", line) for line in lines]
    rows = {float(m[1]): (int(m[2]), int(m[3])) for m in table if m}
    (tokens0, video0), (tokens75, video75) = rows[0.0], rows[0.75]
    assert video0 == 800 and video75 == max(100, int(800 * 0.25))  # 8 groups of 10x10; the EVS count written out
    assert tokens0 - tokens75 == video0 - video75
    # no single-request latency, which on the tiny model says nothing about pruning: the measured table instead
    assert " ms" not in done.stdout and "Measured speed-ups: README.md" in done.stdout
    assert lines[-2].startswith("reply at q=0.75")
    picture = tmp_path / lines[-1].rsplit(": ", 1)[1]
    assert picture.exists() and Image.open(picture).size[0] > 0
