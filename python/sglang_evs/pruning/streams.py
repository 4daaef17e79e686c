"""A request's videos as consecutive segments of one stream (`video_stream`): placed and pruned as one video.

Deployments that watch a camera or a screen send video as it arrives, a few seconds at a time. Each segment would
otherwise reach SGLang as a video of its own: its timestamps start again at 0, and EVS keeps its first group whole,
since nothing came before it (a static camera keeps a full group per segment). With `video_stream` the request's
videos are one stream, in order, and in a session (`stream_sessions.py`) the request's first video continues the
session's last one:

  - timestamps continue (`continuing_timestamps`, on the upstream processor's way to the HF processor): each
    segment's sampled frame indices are shifted by the frames of the segments before it, so Qwen3-VL's
    `<t seconds>` framing text counts on; the M-RoPE positions of the prompt continue as its tokens do;
  - a pruned segment that continues one before it carries the stream's group before it, that segment's last
    temporal group of patches (`attach_contexts`, `fields.STREAM_CONTEXT`): the model encodes it before the
    segment's own patches (a Qwen-VL tower attends within a temporal group, so its rows are the ones the previous
    segment had) and scores the segment against it (`methods.stream`: a rate, budget or floor per segment, a
    threshold per group); its key folds their digest, so one segment after two different streams never shares
    cache entries.

Served for the model types of `STREAMED_MODEL_TYPES`. Qwen3-VL and its kin (`TIMESTAMPED_MODEL_TYPES`: their
processor writes timestamps from the sampled frames) get both. Qwen2.5-VL and Qwen2-VL (`UNTIMESTAMPED_MODEL_TYPES`)
write no timestamps, and upstream's `get_rope_index` already places each of a request's videos after the one before
it (absolute time for Qwen2.5-VL), as HF lays out several videos: for them a stream is the context-group pruning
alone, at the positions HF gives the request's videos. Their videos of one request come bundled in one item, split
per video before the contexts are attached (`regions.split_bundled_videos`).

What a stream cannot change mid-way is refused, naming it: the fps (timestamps would not continue) and a segment's
frame size (EVS compares the same cell across groups); so are the other families and the device feature transport
(a device handle's pixels are the scheduler's to read).
"""

import hashlib
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch

from sglang_evs.methods import STREAM_SETTING
from sglang_evs.pruning.fields import STREAM_CONTEXT, video_grid
from sglang_evs.pruning.keys import is_device_handle
from sglang_evs.served import serves

# The model types whose SGLang processor hands the HF processor each video's sampled frame indices and fps, from
# which Qwen3-VL's processor writes the timestamps (`QwenVLImageProcessor._process_mm_data_uncached`): a stream's
# frame indices continue (`continuing_timestamps`).
TIMESTAMPED_MODEL_TYPES = frozenset({"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen4_exp"})
# The model types that write no timestamps and whose `get_rope_index` places each video of a request after the one
# before it: a stream is its context-group pruning alone.
UNTIMESTAMPED_MODEL_TYPES = frozenset({"qwen2_5_vl", "qwen2_vl"})
STREAMED_MODEL_TYPES = TIMESTAMPED_MODEL_TYPES | UNTIMESTAMPED_MODEL_TYPES


@dataclass(frozen=True)
class StreamEnd:
    """Where a stream's last segment ended: what its next segment continues from."""

    frames: int  # the frames up to the end of the last segment (the next one's frame indices count on from here)
    fps: float | None  # None where the family writes no timestamps (its processor reads no frame times)
    grid_hw: tuple[int, int]  # the segments' frame size, in patches
    patches: torch.Tensor | None  # [h * w, patch width] the last temporal group of patches; None once let go

    @property
    def nbytes(self) -> int:
        return 0 if self.patches is None else self.patches.numel() * self.patches.element_size()


@dataclass
class StreamTurn:
    """A request's place in a stream while its media are processed (`STREAM_TURN`)."""

    continues: bool  # its videos are marked `video_stream`
    start: StreamEnd | None  # what its first video continues (a session's last video); None: a stream starts here
    frames: int = 0  # set by `continuing_timestamps`: the frames up to the end of the request's last video
    fps: float | None = None


# The request being processed (this asyncio task), set around the upstream processor's call: a `video_stream` request
# or a session turn (whose last video a later turn may continue); None for any other request.
STREAM_TURN: ContextVar[StreamTurn | None] = ContextVar("sglang_evs_stream_turn", default=None)


def refuse_unstreamable(model_type: str, request_obj, transport_on_device: bool, tokenizer_workers: int = 1) -> None:
    """A `video_stream` request the server cannot serve as one stream: ValueError (HTTP 400) naming why. (One without
    a video is refused where every request passes, `refuse_streams_nothing_serves`.)"""
    if model_type not in STREAMED_MODEL_TYPES:
        raise ValueError(
            f"{STREAM_SETTING}: served for the model types {', '.join(sorted(STREAMED_MODEL_TYPES))}, "
            f"not {model_type!r} yet"
        )
    if getattr(request_obj, "session_params", None) and tokenizer_workers > 1:
        raise ValueError(
            f"{STREAM_SETTING} in a session: each of the server's {tokenizer_workers} tokenizer workers keeps its own "
            "sessions' streams, and a turn may reach another; serve with --tokenizer-worker-num 1"
        )
    if transport_on_device:
        raise ValueError(
            f"{STREAM_SETTING}: the segments' pixels are held as a device handle here; serve with "
            "--mm-feature-transport cpu to prune a stream"
        )


def refuse_streams_nothing_serves(tokenizer_manager, obj, *args, **kwargs) -> None:
    """BEFORE hook on `TokenizerManager._validate_one_request`, which every request passes, media or none: a request
    marked `video_stream` that has no video, or whose model the plugin does not serve (nothing would read the mark),
    fails with HTTP 400 naming it; any other request is SGLang's alone."""
    if not (getattr(obj, "mm_processor_kwargs", None) or {}).get(STREAM_SETTING):
        return
    config = tokenizer_manager.model_config.hf_config
    if not serves(config):
        architecture = (getattr(config, "architectures", None) or ["this model"])[0]
        raise ValueError(f"{STREAM_SETTING}: sglang-evs does not serve {architecture}, so nothing would read it")
    if not getattr(obj, "video_data", None):
        raise ValueError(f"{STREAM_SETTING}: the request has no video")


def continuing_timestamps(video_metadata: list[dict | None], turn: StreamTurn) -> list[dict | None]:
    """Each video's metadata (SGLang's `preprocess_video`: fps, total_num_frames, frames_indices), for a stream
    (`turn.continues`) with its frame indices shifted by the frames of the segments before it, so that its
    timestamps continue the stream's; any other request's as they are. Sets `turn.frames` and `turn.fps` (where the
    request's last video ends). ValueError naming the segment whose fps differs from the stream's."""
    start = turn.start if turn.continues else None
    before, fps = (start.frames, start.fps) if start is not None else (0, None)
    out = []
    for index, metadata in enumerate(video_metadata):
        if metadata is None:
            if turn.continues:
                raise ValueError(f"{STREAM_SETTING}: segment {index} came without its frame times")
            out.append(metadata)
            continue
        if not turn.continues:
            before, fps = 0, metadata["fps"]  # each video on its own: the last one is where a stream could go on
        fps = metadata["fps"] if fps is None else fps
        if not np.isclose(metadata["fps"], fps):
            raise ValueError(f"{STREAM_SETTING}: segment {index} is at {metadata['fps']:g} fps, the stream at {fps:g}")
        out.append({**metadata, "frames_indices": np.asarray(metadata["frames_indices"]) + before})
        before += int(metadata["total_num_frames"])
    turn.frames, turn.fps = before, fps
    return out


def attach_contexts(videos: list, start: StreamEnd | None = None) -> None:
    """Each segment that continues one before it (the request's videos after its first; the first too, where it
    continues `start`, a session's last video) gets the stream's group before it (that segment's last temporal group
    of patches, `STREAM_CONTEXT`, with their digest for its key). ValueError naming a segment whose frame size
    differs from the stream's."""
    before = [start] + [stream_end(video) for video in videos[:-1]]
    for index, (previous, video) in enumerate(zip(before, videos, strict=True)):
        if previous is None:
            continue
        _, height, width = video_grid(video)
        if (height, width) != previous.grid_hw:
            before_height, before_width = previous.grid_hw
            raise ValueError(
                f"{STREAM_SETTING}: segment {index} is {height}x{width} patches, the stream "
                f"{before_height}x{before_width}"
            )
        if previous.patches is not None:  # let go under the bound (`stream_sessions`): scored as a stream's start
            digest = hashlib.sha256(previous.patches.view(torch.uint8).numpy().tobytes()).hexdigest()
            video.set(STREAM_CONTEXT, {"patches": previous.patches, "digest": digest})


def stream_end(video, frames: int = 0, fps: float | None = 0.0) -> StreamEnd:
    """Where a segment ends: its last temporal group of patches (a copy, on the CPU) and its frame size, with the
    stream's `frames` and `fps` so far. ValueError where its pixels are not readable here."""
    _, height, width = video_grid(video)
    if is_device_handle(video.feature) or not isinstance(video.feature, torch.Tensor):
        raise ValueError(f"{STREAM_SETTING}: a segment's pixels are not readable here")
    patches = video.feature[-height * width :].detach().to("cpu", copy=True).contiguous()
    return StreamEnd(frames=frames, fps=fps, grid_hw=(height, width), patches=patches)
