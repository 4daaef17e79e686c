"""Video-MME multiple-choice accuracy on a local copy, on one server or per EVS pruning rate.

    python -m sglang_evs.bench.videomme --data-dir DIR --base-url URL [--limit N] [--output r.json]
    python -m sglang_evs.bench.videomme --data-dir DIR --model PATH --rates 0 0.5 0.75 [--server-args "..."]
    python -m sglang_evs.bench.videomme --data-dir DIR --model PATH --rates 0.75 --method vidcom2

DIR: the rows as ``DIR/videomme/test-*.parquet`` (the hub layout of lmms-lab/Video-MME, needs
pyarrow) or ``DIR/videomme.jsonl``; the videos as ``DIR/data/<videoID>.mp4`` (the hub zips
unpacked), falling back to ``<video_id>.mp4``. Row fields: video_id, duration, domain, sub_category,
question_id, task_type, question, options (``["A. ...", "B. ...", ...]``), answer (a letter),
optionally videoID. Fixture: ``python -m sglang_evs.bench.videomme_fixture DIR``.

Each question is one chat request: the video (``file://``) and Video-MME's official prompt
(without subtitles); the reply's letter is parsed as in lmms-eval's Video-MME task. Reports
accuracy overall, per duration and per task type, and the mean server-reported prompt tokens.
"""

import argparse
import json
import re
import statistics
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from sglang_evs.methods import METHODS

PROMPT = (
    "Select the best answer to the following multiple-choice question based on the video. "
    "Respond with only the letter (A, B, C, or D) of the correct option.\n{question}\n{options}\nThe best answer is:"
)
ANSWER_PREFIXES = ("The best answer is", "The correct answer is", "The answer is", "The answer",
                   "The best option is", "The correct option is", "Best answer:", "Best option:")  # fmt: skip


def load_rows(data_dir: str | Path) -> list[dict]:
    """Question rows, each with ``video_path`` (absolute) added."""
    root = Path(data_dir).resolve()
    parquet = sorted((root / "videomme").glob("test-*.parquet"))
    if parquet:
        import pyarrow.parquet as pq

        rows = [row for f in parquet for row in pq.read_table(f).to_pylist()]
    else:
        rows = [json.loads(line) for line in (root / "videomme.jsonl").read_text().splitlines() if line.strip()]
    for row in rows:
        names = [n for n in (row.get("videoID"), row["video_id"]) if n]
        row["video_path"] = next((p for n in names if (p := root / "data" / f"{n}.mp4").exists()), None)
        if row["video_path"] is None:
            raise FileNotFoundError(f"no video for question {row['question_id']} ({names}) under {root / 'data'}")
    return rows


def build_prompt(row: dict) -> str:
    """Video-MME's official multiple-choice prompt (no subtitles)."""
    return PROMPT.format(question=row["question"], options="\n".join(row["options"]))


def extract_letter(response: str) -> str:
    """The answer letter of a reply, or "" (lmms-eval videomme ``extract_characters_regex``)."""
    s = response.strip()
    for prefix in ANSWER_PREFIXES:
        s = s.replace(prefix, "")
    if len(s.split()) > 10 and not re.search("[ABCD]", s):
        return ""
    match = re.search("[ABCD]", s)
    return match[0] if match else ""


def score(rows: list[dict], replies: list[str]) -> dict:
    """Accuracy overall and per duration / task_type: ``{"accuracy", "num", "per_duration", "per_task_type"}``."""
    correct = [extract_letter(reply) == row["answer"] for row, reply in zip(rows, replies, strict=True)]
    groups: dict[str, dict[str, list[bool]]] = {"duration": defaultdict(list), "task_type": defaultdict(list)}
    for row, ok in zip(rows, correct, strict=True):
        for key, group in groups.items():
            group[row[key]].append(ok)

    def table(group: dict[str, list[bool]]) -> dict:
        return {k: {"num": len(v), "acc": sum(v) / len(v)} for k, v in sorted(group.items())}

    return {"accuracy": sum(correct) / len(correct), "num": len(correct),
            "per_duration": table(groups["duration"]), "per_task_type": table(groups["task_type"])}  # fmt: skip


def ask(base_url: str, row: dict, max_tokens: int = 16) -> tuple[str, int]:
    """One question -> (reply text, server-reported prompt tokens)."""
    content = [{"type": "video_url", "video_url": {"url": f"file://{row['video_path']}"}},
               {"type": "text", "text": build_prompt(row)}]  # fmt: skip
    body = {"model": "default", "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0}  # fmt: skip
    response = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=1800)
    response.raise_for_status()
    out = response.json()
    return out["choices"][0]["message"]["content"] or "", out["usage"]["prompt_tokens"]


def evaluate(base_url: str, rows: list[dict], num_threads: int = 4, max_tokens: int = 16) -> dict:
    """Ask every question (``num_threads`` at a time); score() plus ``mean_prompt_tokens`` and ``replies``."""
    from tqdm import tqdm

    with ThreadPoolExecutor(num_threads) as pool:
        answers = list(tqdm(pool.map(lambda r: ask(base_url, r, max_tokens), rows), total=len(rows), desc="Video-MME"))
    result = score(rows, [a for a, _ in answers])
    result["mean_prompt_tokens"] = statistics.fmean(n for _, n in answers)
    result["replies"] = {row["question_id"]: a for row, (a, _) in zip(rows, answers, strict=True)}
    return result


def evaluate_rates(model: str, rows: list[dict], rates: list[float], out_dir: Path, server_args: list[str] = (),
                   method: str = "evs", **kwargs) -> dict:  # fmt: skip
    """One server per pruning rate, pruning with ``method`` (``launch.serving``): ``{str(rate): evaluate(...)}``."""
    from sglang_evs.bench.launch import rate_args, serving

    results = {}
    for rate in rates:
        log = out_dir / f"server-videomme-{method}-q{rate}.log"
        with serving(model, log, [*server_args, *rate_args(rate, method)]) as server:
            results[str(rate)] = evaluate(server.base_url, rows, **kwargs)
    return results


def main() -> None:
    import shlex

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--base-url", help="an already running server")
    target.add_argument("--model", help="launch a server on this checkpoint per --rates")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0], help="q (VidCom2: 1 - retention ratio)")
    parser.add_argument("--method", choices=sorted(METHODS), default="evs", help="with --model: the pruning method")
    parser.add_argument("--server-args", default="--dtype float32", help='with --model; on a GPU e.g. "--device cuda"')
    parser.add_argument("--limit", type=int)
    parser.add_argument("--num-threads", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    rows = load_rows(args.data_dir)[: args.limit]
    kwargs = {"num_threads": args.num_threads, "max_tokens": args.max_tokens}
    if args.base_url:
        results = {"server": evaluate(args.base_url, rows, **kwargs)}
    else:
        out_dir = (args.output.parent if args.output else Path(".cache/bench")) / "logs"
        results = evaluate_rates(args.model, rows, args.rates, out_dir, shlex.split(args.server_args), args.method,
                                 **kwargs)  # fmt: skip
    for key, r in results.items():
        print(f"{key}: accuracy {r['accuracy']:.4f} over {r['num']} questions, "
              f"{r['mean_prompt_tokens']:.0f} prompt tokens/question")  # fmt: skip
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
