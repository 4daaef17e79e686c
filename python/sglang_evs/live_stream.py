"""sglang-evs-stream: a live source sent to a server as it records, one session turn per segment.

    sglang-evs-stream SOURCE --url http://localhost:30000 --segment-s 2 --question "What changed?"

SOURCE is a file, a capture device (`/dev/video0`, with `--input-format v4l2`) or a network stream (`rtsp://...`),
decoded with PyAV, the decoder SGLang reads videos with. Its frames are cut into segments of `--segment-s` seconds
at the source's pace (a file is paced in real time unless `--as-fast-as-possible`), each written as a near-lossless
H.264 clip at the source's frame rate and sent as a turn of one session on `/generate`: the first starts the
stream, each later one is marked `video_stream` (its timestamps count on, its first frame group is scored against
the segment before it). Each answer is printed with its time to first token and the video tokens kept and pruned.
The session is closed when the source ends or on Ctrl-C.

The prompt of a turn is the checkpoint's chat template around the segment and the question: the processor of the
server's model path (`/model_info`), or of `--model`. A turn names the one before it (`session_params.rid`), so a
server with or without `--enable-streaming-session` serves it. Each turn is sent once the answer before it is in,
while the source goes on being read and cut in a thread of its own (`captured`).
"""

import argparse
import queue
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import requests

from sglang_evs.streamed import streamed_chunks
from sglang_evs.testing import media


@dataclass(frozen=True)
class Answer:
    text: str
    ttft_s: float  # from sending the turn to its first streamed token
    kept: int | None  # the segment's video tokens kept (None: not pruned, all kept)
    pruned: int  # and pruned
    rid: str


def cut_segments(
    source: str, segment_s: float, out_dir: Path, realtime: bool = True, input_format: str | None = None
) -> Iterator[Path]:
    """The source's frames, `segment_s` seconds per segment, each written to `out_dir` as an H.264 clip at the
    source's frame rate once its last frame is decoded (the last segment may be shorter). `realtime`: a file is
    read no faster than it plays."""
    import av

    with av.open(source, format=input_format) as container:
        stream = container.streams.video[0]
        fps = stream.average_rate or stream.guessed_rate or Fraction(30)
        per_segment = max(1, round(segment_s * float(fps)))
        frames, start, index = [], time.monotonic(), 0
        for frame in container.decode(stream):
            frames.append(frame.to_ndarray(format="rgb24"))
            if len(frames) == per_segment:
                if realtime:
                    time.sleep(max(0.0, start + (index + 1) * per_segment / float(fps) - time.monotonic()))
                yield write_segment(out_dir / f"segment-{index:05d}.mp4", frames, fps)
                frames, index = [], index + 1
        if frames:
            yield write_segment(out_dir / f"segment-{index:05d}.mp4", frames, fps)


def write_segment(path: Path, frames: list, fps: Fraction) -> Path:
    """uint8 RGB [H, W, 3] frames as near-lossless H.264 (`testing.media.write_mp4`; yuv420p: even sizes, cropped by
    a pixel if odd)."""
    height, width = (frames[0].shape[0] // 2) * 2, (frames[0].shape[1] // 2) * 2
    return media.write_mp4(path, np.stack([frame[:height, :width] for frame in frames]), fps=fps)


def turn_prompt(model: str, question: str) -> str:
    """One user turn with a video and the question, in the checkpoint's chat template, ready for the reply."""
    from transformers import AutoProcessor

    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}]
    return AutoProcessor.from_pretrained(model).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def send_turn(url: str, session: str, parent: str | None, prompt: str, segment: Path, settings: dict,
              max_new_tokens: int) -> Answer:  # fmt: skip
    """One segment as a session turn after `parent` (None: the stream's first), its reply streamed."""
    body = {"text": prompt, "video_data": [str(segment)], "stream": True,
            "session_params": {"id": session, "rid": parent},
            "mm_processor_kwargs": {**settings, **({"video_stream": True} if parent else {})},
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}  # fmt: skip
    chunks = list(streamed_chunks(f"{url}/generate", body))  # each with its arrival: the first's is the TTFT
    (first, _), (_, last) = chunks[0], chunks[-1]
    meta = last["meta_info"]
    before, after = meta.get("video_tokens_before_pruning"), meta.get("video_tokens_after_pruning")
    pruned = before - after if after is not None else 0
    return Answer(last["text"], first, after, pruned, meta["id"])


def captured(segments: Iterator[Path]) -> Iterator[Path]:
    """`segments`, cut in a thread of their own: the source is read at its pace while a turn waits for its answer
    (a capture device's frames would otherwise pile up in its buffer, or be dropped). What the capture raised is
    raised here, in order."""
    ready: queue.Queue = queue.Queue()

    def capture() -> None:
        try:
            for segment in segments:
                ready.put(segment)
            ready.put(None)
        except BaseException as error:  # noqa: BLE001 - handed to the reader
            ready.put(error)

    threading.Thread(target=capture, name="capture", daemon=True).start()
    while (item := ready.get()) is not None:
        if isinstance(item, BaseException):
            raise item
        yield item


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="a video file, a capture device or a network stream")
    parser.add_argument("--url", default="http://localhost:30000")
    parser.add_argument("--segment-s", type=float, default=2.0)
    parser.add_argument("--question", default="What is happening now?")
    parser.add_argument("--model", help="the checkpoint whose chat template frames a turn (default: the server's)")
    parser.add_argument("--input-format", help="PyAV's input format of a device (v4l2, avfoundation, ...)")
    parser.add_argument("--as-fast-as-possible", action="store_true", help="read a file without pacing it")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--video-pruning-rate", type=float)
    parser.add_argument("--video-pruning-method")
    parser.add_argument("--video-pruning-threshold", type=float)
    args = parser.parse_args(argv)
    named = {"video_pruning_rate": args.video_pruning_rate, "video_pruning_method": args.video_pruning_method,
             "video_pruning_threshold": args.video_pruning_threshold}  # fmt: skip
    settings = {key: value for key, value in named.items() if value is not None}
    model = args.model or requests.get(f"{args.url}/model_info", timeout=30).json()["model_path"]
    prompt = turn_prompt(model, args.question)
    session = requests.post(f"{args.url}/open_session", json={"capacity_of_str_len": 1 << 20}, timeout=60)
    session.raise_for_status()
    session_id, parent = session.json(), None
    try:
        with tempfile.TemporaryDirectory(prefix="sglang-evs-stream-") as folder:
            segments = captured(cut_segments(args.source, args.segment_s, Path(folder), not args.as_fast_as_possible,
                                             args.input_format))  # fmt: skip
            for index, segment in enumerate(segments):
                answer = send_turn(args.url, session_id, parent, prompt, segment, settings, args.max_new_tokens)
                parent = answer.rid
                kept = "all" if answer.kept is None else answer.kept
                print(f"[segment {index}] TTFT {answer.ttft_s * 1e3:.0f} ms, video tokens kept {kept}, "
                      f"pruned {answer.pruned}: {answer.text.strip()}", flush=True)  # fmt: skip
                segment.unlink()
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        requests.post(f"{args.url}/close_session", json={"session_id": session_id}, timeout=60)


if __name__ == "__main__":
    main()
