"""decord's `VideoReader` and `cpu`, as SGLang 0.5.23 uses them (`sglang.srt.utils.video_decoder`), over
OpenCV: `len`, `get_avg_fps`, `reader[i].asnumpy()` and `get_batch(indices).asnumpy()`, RGB uint8 frames
[N, H, W, 3]. Frames are decoded in order from the start (no seeking), so frame `i` is the `i`-th decoded
frame, as decord counts them."""

from __future__ import annotations

import cv2
import numpy as np

__version__ = "0.6.0+cv2"


class DECORDError(RuntimeError):
    pass


class _Context:
    def __init__(self, kind: str, device_id: int) -> None:
        self.device_type, self.device_id = kind, device_id


def cpu(device_id: int = 0) -> _Context:
    return _Context("cpu", device_id)


def gpu(device_id: int = 0) -> _Context:
    """Accepted, decoded on the CPU all the same (decord's GPU decoder is a build option)."""
    return _Context("gpu", device_id)


class NDArray:
    """What decord returns: `.asnumpy()` gives the frames."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def asnumpy(self) -> np.ndarray:
        return self._array

    @property
    def shape(self) -> tuple[int, ...]:
        return self._array.shape


def _open(uri: str) -> cv2.VideoCapture:
    capture = cv2.VideoCapture(str(uri))
    if not capture.isOpened():
        raise DECORDError(f"cannot open video {uri!r} with OpenCV")
    return capture


class VideoReader:
    def __init__(self, uri, ctx: _Context | None = None, width: int = -1, height: int = -1, num_threads: int = 0,
                 fault_tol: int = -1) -> None:  # fmt: skip
        self._uri = str(uri)
        self._size = (width, height) if width > 0 and height > 0 else None
        capture = _open(self._uri)
        try:
            self._fps = float(capture.get(cv2.CAP_PROP_FPS) or 0.0)
            count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
            if count <= 0:  # a container without a frame count: count by decoding
                while capture.grab():
                    count += 1
        finally:
            capture.release()
        if count <= 0:
            raise DECORDError(f"no frames in video {self._uri!r}")
        self._count = count

    def __len__(self) -> int:
        return self._count

    def get_avg_fps(self) -> float:
        return self._fps

    def __getitem__(self, index: int) -> NDArray:
        return NDArray(self.get_batch([index]).asnumpy()[0])

    def get_batch(self, indices) -> NDArray:
        wanted = [int(i) + self._count if int(i) < 0 else int(i) for i in np.asarray(indices).reshape(-1)]
        for i in wanted:
            if not 0 <= i < self._count:
                raise IndexError(f"frame {i} out of range for a video of {self._count} frames")
        frames: dict[int, np.ndarray] = {}
        capture = _open(self._uri)
        try:
            position = 0
            for target in sorted(set(wanted)):
                while position < target:
                    if not capture.grab():
                        raise DECORDError(f"video {self._uri!r} ended at frame {position}, before frame {target}")
                    position += 1
                ok, frame = capture.read()
                if not ok:
                    raise DECORDError(f"cannot decode frame {target} of video {self._uri!r}")
                position += 1
                frame = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
                if self._size is not None:
                    frame = cv2.resize(frame, self._size, interpolation=cv2.INTER_LINEAR)
                frames[target] = frame
        finally:
            capture.release()
        return NDArray(np.stack([frames[i] for i in wanted]))


__all__ = ["DECORDError", "NDArray", "VideoReader", "cpu", "gpu"]
