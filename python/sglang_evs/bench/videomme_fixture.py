"""Write a tiny Video-MME-format set (synthetic clips), for lmms-eval's own Video-MME task run through the plugin's
backend (test/bench/test_lmms_eval.py; docs/accuracy.md).

    python -m sglang_evs.bench.videomme_fixture OUT_DIR

Writes ``OUT_DIR/data/<videoID>.mp4`` (one static, one moving, one noise clip) and
``OUT_DIR/videomme.jsonl``: two questions per video in Video-MME's row schema (video_id,
duration, domain, sub_category, url, videoID, question_id, task_type, question, options
``["A. ...", ...]``, answer letter).
"""

import argparse
import json
from pathlib import Path

from sglang_evs.testing import media

VIDEOS = {"001": "static", "002": "moving", "003": "noise"}
QUESTIONS = (
    ("Object Recognition", "What is the main object in the video?",
     ["A. A red square.", "B. A dog.", "C. A car.", "D. Nothing."], {"static": "D", "moving": "A", "noise": "D"}),
    ("Action Recognition", "Does anything move in the video?",
     ["A. Yes, everything changes.", "B. Yes, a small square.", "C. No.", "D. Only the background."],
     {"static": "C", "moving": "B", "noise": "A"}),
)  # fmt: skip


def write_fixture(out_dir: str | Path, num_frames: int = 8, size: int = 64) -> list[dict]:
    """Write clips and rows; return the rows."""
    out = Path(out_dir)
    rows = []
    for video_id, kind in VIDEOS.items():
        video_name = f"synthetic_{kind}"
        media.write_clip(out / "data" / f"{video_name}.mp4", kind, fps=4, num_frames=num_frames, height=size,
                         width=size, seed=int(video_id))  # fmt: skip
        for i, (task, question, options, answers) in enumerate(QUESTIONS, start=1):
            rows.append({
                "video_id": video_id, "duration": "short", "domain": "Synthetic", "sub_category": kind,
                "url": "", "videoID": video_name, "question_id": f"{video_id}-{i}", "task_type": task,
                "question": question, "options": options, "answer": answers[kind],
            })  # fmt: skip
    (out / "videomme.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    args = parser.parse_args()
    print(f"wrote {len(write_fixture(args.out_dir))} questions to {args.out_dir}")


if __name__ == "__main__":
    main()
