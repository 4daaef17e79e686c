"""A request's videos as one stream's segments (`pruning/streams.py`): timestamps that continue, each continued
segment's context group, and what is refused by name. Served end to end in test/models/test_evs_serving.py."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem

from sglang_evs.pruning import streams
from sglang_evs.pruning.fields import STREAM_CONTEXT, continues_stream


def segment_metadata(frames: int, sampled: list[int], fps: float = 4.0) -> dict:
    """As SGLang's `preprocess_video` describes a video: its frames, fps and the indices it sampled."""
    return {"fps": fps, "duration": frames / fps, "total_num_frames": frames, "frames_indices": np.array(sampled)}


def test_each_segments_frames_count_on_from_the_segments_before_it():
    stream = [segment_metadata(16, [0, 5, 10, 15]), segment_metadata(8, [0, 7]), segment_metadata(16, [0, 15])]
    turn = streams.StreamTurn(continues=True, start=None)
    shifted = streams.continuing_timestamps(stream, turn)
    assert [m["frames_indices"].tolist() for m in shifted] == [[0, 5, 10, 15], [16, 23], [24, 39]]
    assert stream[1]["frames_indices"].tolist() == [0, 7]  # the processor's own metadata is left as it was
    assert (turn.frames, turn.fps) == (40, 4.0)


def test_a_turn_continues_from_where_its_sessions_last_video_ended():
    start = streams.StreamEnd(frames=40, fps=4.0, grid_hw=(2, 4), patches=None)
    turn = streams.StreamTurn(continues=True, start=start)
    shifted = streams.continuing_timestamps([segment_metadata(8, [0, 7])], turn)
    assert shifted[0]["frames_indices"].tolist() == [40, 47] and turn.frames == 48
    with pytest.raises(ValueError, match="segment 0 is at 30 fps, the stream at 4"):
        streams.continuing_timestamps([segment_metadata(60, [0, 59], fps=30)], turn)


def test_a_turn_not_marked_keeps_its_timestamps_and_ends_where_its_last_video_does():
    turn = streams.StreamTurn(continues=False, start=None)
    stream = [segment_metadata(16, [0, 15]), segment_metadata(8, [0, 7], fps=2.0)]
    shifted = streams.continuing_timestamps(stream, turn)
    assert [m["frames_indices"].tolist() for m in shifted] == [[0, 15], [0, 7]] and (turn.frames, turn.fps) == (8, 2.0)


def test_a_segment_at_another_fps_is_refused_by_name():
    with pytest.raises(ValueError, match="segment 1 is at 30 fps, the stream at 4"):
        streams.continuing_timestamps(
            [segment_metadata(16, [0, 15]), segment_metadata(60, [0, 59], fps=30)],
            streams.StreamTurn(continues=True, start=None),
        )


def video(grid: tuple[int, int, int], feature: torch.Tensor) -> MultimodalDataItem:
    item = MultimodalDataItem(modality=Modality.VIDEO, offsets=[(0, 1)])
    item.feature = feature
    item.model_specific_data = {"video_grid_thw": torch.tensor([grid])}
    return item


def test_each_continued_segment_carries_the_previous_segments_last_group_of_patches():
    first, second = video((2, 2, 4), torch.arange(16.0).reshape(16, 1)), video((3, 2, 4), torch.zeros(24, 1))
    third = video((1, 2, 4), torch.ones(8, 1))
    streams.attach_contexts([first, second, third])
    digests = [item.model_specific_data.get(STREAM_CONTEXT, {}).get("digest") for item in (first, second, third)]
    assert not continues_stream(first) and continues_stream(second) and continues_stream(third)
    assert second.model_specific_data[STREAM_CONTEXT]["patches"].flatten().tolist() == list(range(8, 16))
    assert third.model_specific_data[STREAM_CONTEXT]["patches"].flatten().tolist() == [0.0] * 8
    assert digests[0] is None and len({*digests[1:]}) == 2  # two different contexts, two different keys


def test_a_requests_first_segment_continues_the_end_it_is_given_and_one_let_go_starts_afresh():
    before = streams.stream_end(video((2, 2, 4), torch.arange(16.0).reshape(16, 1)), frames=32, fps=4.0)
    assert before.grid_hw == (2, 4) and before.patches.flatten().tolist() == list(range(8, 16))
    segment = video((2, 2, 4), torch.zeros(16, 1))
    streams.attach_contexts([segment], before)
    assert torch.equal(segment.model_specific_data[STREAM_CONTEXT]["patches"], before.patches)
    let_go = video((2, 2, 4), torch.zeros(16, 1))
    streams.attach_contexts([let_go], replace(before, patches=None))
    assert not continues_stream(let_go)
    with pytest.raises(ValueError, match="segment 0 is 4x4 patches, the stream 2x4"):
        streams.attach_contexts([video((2, 4, 4), torch.zeros(32, 1))], before)


def request(video_data=None, stream=True) -> SimpleNamespace:
    return SimpleNamespace(mm_processor_kwargs={"video_stream": stream}, video_data=video_data)


def tokenizer_for(architecture: str) -> SimpleNamespace:
    return SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(architectures=[architecture])))


def test_the_mark_with_no_video_or_on_a_model_not_served_is_refused_and_any_other_request_left_alone():
    served, other = tokenizer_for("Qwen3VLForConditionalGeneration"), tokenizer_for("LlavaForConditionalGeneration")
    with pytest.raises(ValueError, match="the request has no video"):
        streams.refuse_streams_nothing_serves(served, request())
    with pytest.raises(ValueError, match="does not serve LlavaForConditionalGeneration"):
        streams.refuse_streams_nothing_serves(other, request(["clip.mp4"]))
    for tokenizer in (served, other):
        streams.refuse_streams_nothing_serves(tokenizer, request(stream=False))
        streams.refuse_streams_nothing_serves(tokenizer, SimpleNamespace(video_data=None))
    streams.refuse_streams_nothing_serves(served, request(["clip.mp4"]))


@pytest.mark.parametrize(
    ("model_type", "fields", "on_device", "message"),
    [
        ("glm4v", {"video_data": ["a.mp4"]}, False, r"model types .*qwen2_5_vl.*qwen3_vl.*, not 'glm4v'"),
        ("qwen3_omni_moe", {"video_data": ["a.mp4"]}, False, "not 'qwen3_omni_moe' yet"),
        ("qwen3_vl", {"video_data": ["a.mp4"]}, True, "--mm-feature-transport cpu"),
        ("qwen2_5_vl", {"video_data": ["a.mp4"]}, True, "--mm-feature-transport cpu"),
    ],
)
def test_what_a_server_cannot_serve_as_one_stream_yet_is_refused_by_name(model_type, fields, on_device, message):
    with pytest.raises(ValueError, match=message):
        streams.refuse_unstreamable(model_type, SimpleNamespace(**fields), on_device)


def test_a_stream_in_a_session_across_tokenizer_workers_is_refused_by_name():
    turn = SimpleNamespace(video_data=["a.mp4"], session_params={"id": "s"})
    with pytest.raises(ValueError, match="serve with --tokenizer-worker-num 1"):
        streams.refuse_unstreamable("qwen3_vl", turn, False, tokenizer_workers=2)
    streams.refuse_unstreamable("qwen3_vl", turn, False, tokenizer_workers=1)
    streams.refuse_unstreamable("qwen3_vl", SimpleNamespace(video_data=["a.mp4"]), False, tokenizer_workers=2)


@pytest.mark.parametrize("model_type", ["qwen3_vl", "qwen3_5", "qwen4_exp", "qwen2_5_vl", "qwen2_vl"])
def test_the_timestamped_families_and_those_that_place_each_video_after_the_last_are_served(model_type):
    streams.refuse_unstreamable(model_type, SimpleNamespace(video_data=["a.mp4"]), False)
