"""A benchmark run's samples, kept as they are measured: each is appended to a JSONL file as one line, and the file
is closed at once, so a run that is killed, stopped or fails part-way keeps every sample it measured before that,
and its summary can be computed again from that file alone. With a progress bar over the samples a run expects:
a run of many minutes says how far it got.
"""

import json
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType


def samples_path(output: Path | None, workdir: Path) -> Path:
    """Where a benchmark's samples go: beside its JSON output (`x.json` -> `x.jsonl`), else `WORKDIR/samples.jsonl`."""
    if output is None:
        return workdir / "samples.jsonl"
    path = Path(output).with_suffix(".jsonl")
    if path == Path(output):
        raise ValueError(f"the output {output} would be its own samples' file: give it another suffix (.json)")
    return path


class SampleLog:
    """The JSONL of one run (started empty: a file holds one run), and, given `total`, a progress bar on stderr
    that each `sample` moves one step. The bar keeps tqdm's defaults: it is drawn also where stderr is no terminal
    (a log then shows how far a run got); `TQDM_DISABLE=1` hides it."""

    def __init__(self, path: Path, total: int | None = None, desc: str | None = None, unit: str = "sample"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        self.bar = None
        if total is not None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit)

    def write(self, record: dict) -> dict:
        """Appends `record` as one line; the file is closed before this returns, so the line is the operating
        system's to keep even if the process is killed the next moment."""
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        return record

    def sample(self, record: dict) -> dict:
        """A measured sample: written, and one step of the bar."""
        self.write(record)
        if self.bar is not None:
            self.bar.update()
        return record

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> "SampleLog":
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: TracebackType | None) -> None:
        self.close()


def read_records(paths: Iterable[Path]) -> list[dict]:
    """The records of the JSONL files, in order; a line cut off by a kill is left out."""
    records = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
