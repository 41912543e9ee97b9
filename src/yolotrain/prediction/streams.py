"""Live video sources for prediction: cameras (``0``, ``1`` ...) and ``rtsp://``, ``rtmp://`` and
``http(s)://`` streams opened with OpenCV.

A live source does not wait for the detector: frames arrive at the camera's rate whether or not they
are consumed. A background thread therefore reads continuously and keeps only the newest frame, so
prediction always works on the present instead of on a growing backlog.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator

import cv2
import numpy as np

STREAM_SCHEMES = ("rtsp://", "rtmp://", "http://", "https://")
# How long closing waits for the reading thread (blocked in a read of a stalled stream at worst).
_CLOSE_TIMEOUT_S = 5.0


def is_stream(source: object) -> bool:
    """Whether ``source`` names a live source: a camera index or a stream URL."""
    if isinstance(source, int) and not isinstance(source, bool):
        return source >= 0
    if not isinstance(source, (str, os.PathLike)):
        return False
    text = os.fspath(source)
    return text.isdigit() or text.lower().startswith(STREAM_SCHEMES)


def frame_rate(cap: cv2.VideoCapture, vid_stride: int = 1) -> float:
    """Frames per second of the frames kept from ``cap``; 30 when the source reports none or nonsense
    (streams and some files report 0, nan or a timebase such as 90000; high-speed cameras reach 1000)."""
    fps = cap.get(cv2.CAP_PROP_FPS)
    return (fps if math.isfinite(fps) and 0 < fps <= 1000 else 30.0) / vid_stride


def strided_frames(cap: cv2.VideoCapture, vid_stride: int = 1) -> Iterator[tuple[int, np.ndarray]]:
    """``(index, BGR frame)`` of every ``vid_stride``-th frame of ``cap`` until it ends; the frames in
    between are only grabbed, not decoded."""
    index = 0
    while True:
        if index % vid_stride:
            if not cap.grab():
                return
        else:
            ok, frame = cap.read()
            if not ok:
                return
            yield index, frame
        index += 1


class LatestFrameReader:
    """Reads a camera or stream on a background thread; iterating yields ``(frame_index, BGR frame)``
    of the newest frame not yet seen, waiting for the next one, and ends when the stream does.

    ``vid_stride`` keeps every N-th frame of the source (the others are only grabbed, not decoded).
    Use as a context manager, or call :meth:`close`, to stop the thread and release the source.

    Raises:
        ValueError: the source cannot be opened (``cannot open stream URL``).
    """

    def __init__(self, source: str | int, vid_stride: int = 1) -> None:
        if vid_stride < 1:
            raise ValueError(f"vid_stride must be at least 1, got {vid_stride}")
        self.source = str(source)
        self._cap = cv2.VideoCapture(int(self.source) if self.source.isdigit() else self.source)
        if not self._cap.isOpened():
            self._cap.release()
            raise ValueError(f"cannot open stream {self.source}")
        self.fps = frame_rate(self._cap, vid_stride)
        self._stride = vid_stride
        self._changed = threading.Condition()
        self._latest: tuple[int, np.ndarray] | None = None
        self._ended = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name=f"stream {self.source}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for index, frame in strided_frames(self._cap, self._stride):
                if self._stop.is_set():
                    break
                with self._changed:
                    self._latest = (index, frame)
                    self._changed.notify_all()
        finally:
            # Released here, by the only thread that reads it, never while a read is in progress.
            self._cap.release()
            with self._changed:
                self._ended = True
                self._changed.notify_all()

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        while True:
            with self._changed:
                # Short waits keep the main thread responsive to Ctrl-C.
                while self._latest is None and not self._ended:
                    self._changed.wait(0.1)
                if self._latest is None:
                    return
                item, self._latest = self._latest, None
            yield item

    @property
    def running(self) -> bool:
        """Whether the reading thread is still alive."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop reading; the thread releases the source as it ends."""
        self._stop.set()
        self._thread.join(_CLOSE_TIMEOUT_S)

    def __enter__(self) -> LatestFrameReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
