"""Write a tiny MMMU-format validation set (generated PNGs) for `sglang_evs.bench.mmmu`.

    python -m sglang_evs.bench.mmmu_fixture OUT_DIR

Subjects and question counts: ``FIXTURE`` (one open question among them). Columns and cell
formats are the hub's (see ``mmmu.COLUMNS``): ``options`` is a Python-literal list in a string,
``answer`` a letter (multiple-choice) or a value (open), unused image columns are null. The hub layout:
``OUT_DIR/<Subject>/validation-00000-of-00001.parquet`` with image cells ``{"bytes", "path"}`` and the
``huggingface`` schema metadata that makes ``datasets`` decode them as images, plus a ``README.md`` declaring
one config per subject, so that ``datasets`` loads ``OUT_DIR`` as ``MMMU/MMMU`` (`mmmu.local_mmmu`).
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from sglang_evs.bench.mmmu import COLUMNS, IMAGE_COLUMNS
from sglang_evs.testing import media

FIXTURE = {"Accounting": 2, "Art": 2, "Math": 3}  # subject -> questions
COLORS = ["red", "green", "blue", "yellow"]


def fixture_rows(out_dir: Path) -> dict[str, list[dict]]:
    """Rows per subject; writes each question's image to ``out_dir/images/<id>.png``."""
    rng = np.random.default_rng(0)
    rows: dict[str, list[dict]] = {}
    for s_index, (subject, count) in enumerate(FIXTURE.items()):
        rows[subject] = []
        for i in range(1, count + 1):
            qid = f"validation_{subject}_{i}"
            media.write_image(out_dir / "images" / f"{qid}.png", 64, 64, seed=10 * s_index + i)
            row = dict.fromkeys(COLUMNS, None)
            is_open = subject == "Math" and i == count
            answer = str(int(rng.integers(2, 9))) if is_open else "ABCD"[int(rng.integers(0, 4))]
            row.update(
                id=qid,
                question=f"<image 1> {'How many squares are there?' if is_open else 'Which color is the square?'}",
                options="[]" if is_open else repr(COLORS),
                explanation="",
                image_1=f"images/{qid}.png",
                img_type="['Diagrams']",
                answer=answer,
                topic_difficulty="Easy",
                question_type="open" if is_open else "multiple-choice",
                subfield=subject,
            )
            rows[subject].append(row)
    return rows


def _features() -> dict:
    value = {"dtype": "string", "_type": "Value"}
    return {c: ({"_type": "Image"} if c in IMAGE_COLUMNS else value) for c in COLUMNS}


def _write_parquet(out: Path, subject: str, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cells = [
        {c: ({"bytes": (out / r[c]).read_bytes(), "path": Path(r[c]).name} if c in IMAGE_COLUMNS and r[c] else r[c])
         for c in COLUMNS}
        for r in rows
    ]  # fmt: skip
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([(c, image if c in IMAGE_COLUMNS else pa.string()) for c in COLUMNS])
    schema = schema.with_metadata({"huggingface": json.dumps({"info": {"features": _features()}})})
    (out / subject).mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(cells, schema=schema), out / subject / "validation-00000-of-00001.parquet")


def write_fixture(out_dir: str | Path) -> dict[str, int]:
    """Write the fixture; return ``{subject: number of questions}``."""
    out = Path(out_dir)
    rows = fixture_rows(out)
    for subject, subject_rows in rows.items():
        _write_parquet(out, subject, subject_rows)
    configs = "".join(
        f"- config_name: {s}\n  data_files:\n  - split: validation\n    path: {s}/validation-*\n" for s in rows
    )
    (out / "README.md").write_text(f"---\nconfigs:\n{configs}---\n# MMMU-format fixture (sglang-evs)\n")
    shutil.rmtree(out / "images")  # embedded in the parquet files
    return {subject: len(r) for subject, r in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    args = parser.parse_args()
    print(json.dumps(write_fixture(args.out_dir)))


if __name__ == "__main__":
    main()
