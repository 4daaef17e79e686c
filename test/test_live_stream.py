"""`sglang-evs-stream`'s pieces without a server (`live_stream.py`); served end to end in
test/models/test_evs_serving.py."""

import av
import pytest

from sglang_evs.live_stream import captured, cut_segments
from sglang_evs.testing import media


def frames_and_rate(path) -> tuple[int, float]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return sum(1 for _ in container.decode(stream)), float(stream.average_rate)


@pytest.mark.parametrize("segment_s, frames", [(2.0, [8, 8]), (3.0, [12, 4]), (10.0, [16])])
def test_a_file_is_cut_into_segments_of_its_frames_at_its_rate(tmp_path, segment_s, frames):
    clip = media.write_clip(tmp_path / "clip.mp4", "moving", num_frames=16, fps=4, seed=1)
    segments = list(cut_segments(str(clip), segment_s, tmp_path, realtime=False))
    assert [frames_and_rate(segment) for segment in segments] == [(count, 4.0) for count in frames]


def test_segments_are_cut_in_a_thread_of_their_own_in_order_and_a_failure_comes_through():
    assert list(captured(iter(range(5)))) == [0, 1, 2, 3, 4]

    def failing():
        yield 1
        raise OSError("the source went away")

    reader = captured(failing())
    assert next(reader) == 1
    with pytest.raises(OSError, match="went away"):
        next(reader)
