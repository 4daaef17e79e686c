"""MMMU accuracy with SGLang's own evaluation, reading MMMU from a local directory.

    python -m sglang_evs.bench.mmmu --data-dir DIR --base-url URL [--limit N] [--max-tokens T]
        [--num-threads 8] [--output mmmu.json]

Runs SGLang's MMMU evaluation (``sglang.test.run_eval``, ``eval_name="mmmu"``) in this process, i.e. SGLang's
``MMMUVLMEval`` unchanged: its sample selection (sorted by id, first ``--limit``), prompt, chat
sampler, answer parsing and per-subject/domain table. The one substitution: the eval module's
``load_dataset("MMMU/MMMU", subject, split="validation")`` (a hub download) reads
``DIR/<Subject>/`` instead. The result also keeps each question's reply, so that two servers
(say, the plugin at q=0 and upstream SGLang) can be compared answer by answer, not only by score.

DIR layouts (columns as on the hub: id, question, options (a Python-literal list as a string),
explanation, image_1..image_7, img_type, answer, topic_difficulty, question_type, subfield):
  * the hub layout, ``hf download MMMU/MMMU --repo-type dataset --local-dir DIR``:
    ``DIR/<Subject>/validation-*.parquet``, image columns ``{"bytes", "path"}`` (needs pyarrow);
  * ``DIR/<Subject>/validation.jsonl``, image columns a path relative to ``DIR`` or null
    (what ``python -m sglang_evs.bench.mmmu_fixture`` writes by default).
Subjects without data are skipped, as SGLang's loader skips subjects it cannot load.
"""

import argparse
import io
import json
import os
from argparse import Namespace
from pathlib import Path

IMAGE_COLUMNS = tuple(f"image_{i}" for i in range(1, 8))
COLUMNS = ("id", "question", "options", "explanation", *IMAGE_COLUMNS, "img_type", "answer",
           "topic_difficulty", "question_type", "subfield")  # fmt: skip


class LocalSplit(list):
    """The slice of ``datasets.Dataset`` that MMMUVLMEval uses: rows as dicts, ``add_column``."""

    def add_column(self, name: str, values: list) -> "LocalSplit":
        return LocalSplit({**row, name: value} for row, value in zip(self, values, strict=True))


def concatenate(splits: list[LocalSplit]) -> LocalSplit:
    return LocalSplit(row for split in splits for row in split)


def _open_image(value, root: Path):
    """A hub image cell (``{"bytes", "path"}``), a relative path, or None -> PIL image or None."""
    from PIL import Image

    if value is None:
        return None
    if isinstance(value, dict):
        if value.get("bytes") is None:
            return Image.open(root / value["path"]) if value.get("path") else None
        return Image.open(io.BytesIO(value["bytes"]))
    return Image.open(root / value)


def read_subject(data_dir: str | Path, subject: str, split: str = "validation") -> LocalSplit:
    """Rows of one subject's split with PIL images in ``image_*``. Raises FileNotFoundError if absent."""
    root = Path(data_dir)
    parquet = sorted((root / subject).glob(f"{split}-*.parquet"))
    jsonl = root / subject / f"{split}.jsonl"
    if parquet:
        import pyarrow.parquet as pq

        rows = [row for f in parquet for row in pq.read_table(f).to_pylist()]
    elif jsonl.exists():
        rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    else:
        raise FileNotFoundError(f"no {split} data for {subject} under {root}")
    for row in rows:
        for col in IMAGE_COLUMNS:
            row[col] = _open_image(row.get(col), root)
    return LocalSplit(rows)


def use_local_data(data_dir: str | Path):
    """Point SGLang's MMMU eval module at ``data_dir``; return the module (``MMMUVLMEval`` inside)."""
    from sglang.test import simple_eval_mmmu_vlm as mmmu_eval

    root = Path(data_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(root)

    def load_dataset(path: str, name: str, split: str) -> LocalSplit:
        if path != "MMMU/MMMU":
            raise ValueError(f"only MMMU/MMMU is local, got {path}")
        return read_subject(root, name, split)

    mmmu_eval.load_dataset = load_dataset
    mmmu_eval.concatenate_datasets = concatenate
    return mmmu_eval


def run_mmmu(
    data_dir: str | Path,
    base_url: str,
    limit: int | None = None,
    max_tokens: int | None = None,
    num_threads: int = 8,
    model: str | None = None,
) -> dict:
    """SGLang's MMMU eval on local data.

    Returns ``{"accuracy", "per_subject": {subj: {num, acc}}, "replies": {id: text}, "metrics"}``;
    ``metrics`` is SGLang's dict (subjects, ``Overall-<domain>``, ``Overall``, ``score``, ``latency``,
    ``output_throughput`` when any tokens came back).
    """
    mmmu_eval = use_local_data(data_dir)
    from sglang.test.run_eval import run_eval_once

    args = Namespace(
        eval_name="mmmu", base_url=base_url, host=None, port=None, model=model, num_examples=limit,
        num_threads=num_threads, max_tokens=max_tokens, temperature=None, top_p=None, repeat=1, api="chat",
    )  # fmt: skip
    # `run_eval`'s own steps for one MMMU run (its eval object, its sampler, its metrics), through its public
    # `run_eval_once`, which returns the eval's result: the conversations, one per sample in sample order
    evaluation = mmmu_eval.MMMUVLMEval(limit, num_threads)
    os.environ.setdefault("OPENAI_API_KEY", "EMPTY")  # as run_eval sets it: SGLang's server takes any key
    result, latency, sampler = run_eval_once(args, f"{base_url}/v1", evaluation)
    replies = {
        sample["id"]: convo[-1]["content"] for sample, convo in zip(evaluation.samples, result.convos, strict=True)
    }
    metrics = result.metrics | {"score": result.score, "latency": latency}
    completion_tokens = sum(getattr(sampler, "_completion_tokens", ()))  # what run_eval sums for its throughput
    if completion_tokens and latency > 0:
        metrics["output_throughput"] = completion_tokens / latency
    subjects = {s for subs in mmmu_eval.MMMUVLMEval.DOMAIN_CAT2SUB_CAT.values() for s in subs}
    per_subject = {k: v for k, v in metrics.items() if k in subjects}
    return {"accuracy": metrics["score"], "per_subject": per_subject, "replies": replies, "metrics": metrics}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--base-url", required=True, help="server URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--limit", type=int, help="first N questions by id (SGLang's --num-examples)")
    parser.add_argument("--max-tokens", type=int, help="per answer (SGLang's default: 2048)")
    parser.add_argument("--num-threads", type=int, default=8)
    parser.add_argument("--model", help="served model name (default: the server's first)")
    parser.add_argument("--output", type=Path, help="write the result as JSON here")
    args = parser.parse_args()
    result = run_mmmu(args.data_dir, args.base_url, args.limit, args.max_tokens, args.num_threads, args.model)
    for subject, row in sorted(result["per_subject"].items()):
        print(f"{subject:<40} n={row['num']:<5} acc={row['acc']:.3f}")
    print(f"MMMU accuracy: {result['accuracy']:.4f}")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
