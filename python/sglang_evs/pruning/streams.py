"""A request's videos as consecutive segments of one stream (`video_stream`): placed and pruned as one video.

Deployments that watch a camera or a screen send video as it arrives, a few seconds at a time. Each segment would
otherwise reach SGLang as a video of its own: its timestamps start again at 0, and EVS keeps its first group whole,
since nothing came before it (a static camera keeps a full group per segment). With `video_stream` the request's
videos are one stream, in order:

  - timestamps continue (`continuing_timestamps`, on the upstream processor's way to the HF processor): each
    segment's sampled frame indices are shifted by the frames of the segments before it, so Qwen3-VL's
    `<t seconds>` framing text counts on; the M-RoPE positions of the prompt continue as its tokens do;
  - a pruned segment after the first carries the stream's group before it, the previous segment's last temporal
    group of patches (`attach_contexts`, `fields.STREAM_CONTEXT`): the model encodes it before the segment's own
    patches (a Qwen-VL tower attends within a temporal group, so its rows are the ones the previous segment had)
    and scores the segment against it (`methods.stream`: a rate, budget or floor per segment, a threshold per
    group); its key folds their digest, so one segment after two different streams never shares cache entries.

What a stream cannot change mid-way is refused, naming it: the fps (timestamps would not continue) and a segment's
frame size (EVS compares the same cell across groups). Served for the families whose processor writes timestamps
from the sampled frames (Qwen3-VL and its kin, `TIMESTAMPED_MODEL_TYPES`), each request on its own (a session's
turns do not continue a stream yet), over the CPU feature transport (a device handle's pixels are the scheduler's
to read).
"""

import hashlib
from contextvars import ContextVar

import numpy as np
import torch

from sglang_evs.methods import STREAM_SETTING
from sglang_evs.pruning.fields import STREAM_CONTEXT, video_grid
from sglang_evs.pruning.keys import is_device_handle
from sglang_evs.served import serves

# The model types whose SGLang processor hands the HF processor each video's sampled frame indices and fps, from
# which Qwen3-VL's processor writes the timestamps (`QwenVLImageProcessor._process_mm_data_uncached`).
TIMESTAMPED_MODEL_TYPES = frozenset({"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen4_exp"})

# Whether the request being processed (this asyncio task) is a stream: set around the upstream processor's call.
STREAMING: ContextVar[bool] = ContextVar("sglang_evs_streaming", default=False)


def refuse_unstreamable(model_type: str, request_obj, transport_on_device: bool) -> None:
    """A `video_stream` request the server cannot serve as one stream: ValueError (HTTP 400) naming why. (One without
    a video is refused where every request passes, `refuse_streams_nothing_serves`.)"""
    if model_type not in TIMESTAMPED_MODEL_TYPES:
        raise ValueError(
            f"{STREAM_SETTING}: served for the models whose timestamps follow their sampled frames "
            f"({', '.join(sorted(TIMESTAMPED_MODEL_TYPES))}), not {model_type!r} yet"
        )
    if getattr(request_obj, "session_params", None):
        raise ValueError(
            f"{STREAM_SETTING}: a session's turns do not continue a stream yet; send the segments in one request"
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


def continuing_timestamps(video_metadata: list[dict | None]) -> list[dict | None]:
    """Each segment's metadata (SGLang's `preprocess_video`: fps, total_num_frames, frames_indices) with its frame
    indices shifted by the frames of the segments before it, so that its timestamps continue the stream's. ValueError
    naming the segment whose fps differs from the stream's."""
    out, before, fps = [], 0, None
    for index, metadata in enumerate(video_metadata):
        if metadata is None:
            raise ValueError(f"{STREAM_SETTING}: segment {index} came without its frame times")
        fps = metadata["fps"] if fps is None else fps
        if not np.isclose(metadata["fps"], fps):
            raise ValueError(f"{STREAM_SETTING}: segment {index} is at {metadata['fps']:g} fps, the stream at {fps:g}")
        out.append({**metadata, "frames_indices": np.asarray(metadata["frames_indices"]) + before})
        before += int(metadata["total_num_frames"])
    return out


def attach_contexts(videos: list) -> None:
    """Each segment after the first gets the stream's group before it (the previous segment's last temporal group of
    patches, `STREAM_CONTEXT`, with their digest for its key). ValueError naming a segment whose frame size differs
    from the stream's."""
    for index, (previous, video) in enumerate(zip(videos, videos[1:], strict=False), start=1):
        _, height, width = video_grid(video)
        _, before_height, before_width = video_grid(previous)
        if (height, width) != (before_height, before_width):
            raise ValueError(
                f"{STREAM_SETTING}: segment {index} is {height}x{width} patches, the stream "
                f"{before_height}x{before_width}"
            )
        if is_device_handle(previous.feature) or not isinstance(previous.feature, torch.Tensor):
            raise ValueError(f"{STREAM_SETTING}: segment {index - 1}'s pixels are not readable here")
        patches = previous.feature[-height * width :].detach().to("cpu", copy=True).contiguous()
        digest = hashlib.sha256(patches.view(torch.uint8).numpy().tobytes()).hexdigest()
        video.set(STREAM_CONTEXT, {"patches": patches, "digest": digest})
