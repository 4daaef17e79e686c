"""MMMU accuracy with SGLang's own evaluation, reading MMMU from a local directory.

    python -m sglang_evs.bench.mmmu --data-dir DIR --base-url URL [--limit N] [--max-tokens T]
        [--num-threads 8] [--output mmmu.json]

Runs SGLang's MMMU evaluation (``sglang.test.run_eval``, ``eval_name="mmmu"``) in this process: SGLang's
``MMMUVLMEval`` unchanged, its sample selection (sorted by id, first ``--limit``), prompt, chat sampler, answer
parsing and per-subject/domain table. Nothing of SGLang is replaced: its ``load_dataset("MMMU/MMMU", subject,
split="validation")`` finds DIR because ``datasets`` resolves a local directory of that name before the hub, and the
eval prepares its samples from a working directory where ``MMMU/MMMU`` is DIR (`local_mmmu`). The result also keeps
each question's reply (from the eval's own conversations), so that two servers (say, the plugin at q=0 and upstream
SGLang) can be compared answer by answer, not only by score, and what pruning did over the run: how much the
server's image and video token counters grew (`pruned`, by method; empty where the server serves no /metrics or
pruned nothing). A server prunes the eval's images at its own default (`--image-pruning-rate`): the eval's requests
carry no setting.

DIR is the hub layout, as ``hf download MMMU/MMMU --repo-type dataset --local-dir DIR`` writes it (and
``python -m sglang_evs.bench.mmmu_fixture DIR``): ``DIR/<Subject>/validation-*.parquet`` and the ``README.md`` that
declares one config per subject. Subjects without data are skipped, as SGLang's loader skips them.
"""

import argparse
import contextlib
import json
import os
import tempfile
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path

IMAGE_COLUMNS = tuple(f"image_{i}" for i in range(1, 8))
COLUMNS = ("id", "question", "options", "explanation", *IMAGE_COLUMNS, "img_type", "answer",
           "topic_difficulty", "question_type", "subfield")  # fmt: skip


@contextlib.contextmanager
def local_mmmu(data_dir: str | Path) -> Iterator[None]:
    """Within: the working directory holds ``MMMU/MMMU``, a link to ``data_dir``, which ``datasets`` loads for the
    hub's ``MMMU/MMMU``."""
    root = Path(data_dir).resolve()
    if not (root / "README.md").is_file():
        raise FileNotFoundError(f"{root}: no MMMU in the hub layout (README.md and <Subject>/validation-*.parquet)")
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="mmmu-") as work:
        (Path(work) / "MMMU").mkdir()
        (Path(work) / "MMMU" / "MMMU").symlink_to(root, target_is_directory=True)
        os.chdir(work)
        try:
            yield
        finally:
            os.chdir(previous)


def run_mmmu(
    data_dir: str | Path,
    base_url: str,
    limit: int | None = None,
    max_tokens: int | None = None,
    num_threads: int = 8,
    model: str | None = None,
) -> dict:
    """SGLang's MMMU eval on local data.

    Returns ``{"accuracy", "per_subject": {subj: {num, acc}}, "replies": {id: text}, "metrics", "pruned"}``;
    ``metrics`` is SGLang's dict (subjects, ``Overall-<domain>``, ``Overall``, ``score``, ``latency``); ``pruned``
    ``{method: {counter: increase}}`` over the run (`pruning_counters`).
    """
    from sglang.test import simple_eval_mmmu_vlm as mmmu_eval
    from sglang.test.run_eval import run_eval_once

    args = Namespace(
        eval_name="mmmu", base_url=base_url, host=None, port=None, model=model, num_examples=limit,
        num_threads=num_threads, max_tokens=max_tokens, temperature=None, top_p=None, repeat=1, api="chat",
    )  # fmt: skip
    # `run_eval`'s own steps for one MMMU run (its eval object, its sampler, its metrics), through its public
    # `run_eval_once`, which returns the eval's result: the conversations, one per sample in sample order
    with local_mmmu(data_dir):  # the eval reads its samples as it is made
        evaluation = mmmu_eval.MMMUVLMEval(limit, num_threads)
    os.environ.setdefault("OPENAI_API_KEY", "EMPTY")  # as run_eval sets it: SGLang's server takes any key
    counters_before = pruning_counters(base_url)
    result, latency, _ = run_eval_once(args, f"{base_url}/v1", evaluation)
    pruned = counters_grew(counters_before, pruning_counters(base_url))
    replies = {
        sample["id"]: convo[-1]["content"] for sample, convo in zip(evaluation.samples, result.convos, strict=True)
    }
    metrics = result.metrics | {"score": result.score, "latency": latency}
    subjects = {s for subs in mmmu_eval.MMMUVLMEval.DOMAIN_CAT2SUB_CAT.values() for s in subs}
    per_subject = {k: v for k, v in metrics.items() if k in subjects}
    return {"accuracy": metrics["score"], "per_subject": per_subject, "replies": replies, "metrics": metrics,
            "pruned": pruned}  # fmt: skip


def pruning_counters(base_url: str) -> dict[tuple[str, str], float]:
    """The server's pruning counters ((name, method) -> value, `testing.requests.pruning_metrics`); {} where it
    serves no /metrics (started without --enable-metrics)."""
    import requests

    from sglang_evs.testing.requests import pruning_metrics

    try:
        return pruning_metrics(base_url)
    except (requests.RequestException, ValueError):
        return {}


def counters_grew(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[str, dict]:
    """{method: {counter: increase}} of the counters that grew."""
    grew: dict[str, dict] = {}
    for (name, method), value in after.items():
        if value > before.get((name, method), 0.0):
            grew.setdefault(method, {})[name] = value - before.get((name, method), 0.0)
    return grew


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
    for method, grew in result["pruned"].items():
        print(f"pruned by {method}: " + ", ".join(f"{name} +{value:.0f}" for name, value in sorted(grew.items())))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
