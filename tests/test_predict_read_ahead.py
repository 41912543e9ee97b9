"""``predict`` over image files reads the next still on a thread while the current one is predicted: the next read
really starts before it is asked for, results and their order are those of one image at a time, unreadable files
are still skipped and counted, and a read's error or an early end of the stream leaves nothing behind."""

import shutil
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import detecting_yolov5n

from yolotrain.model import Yolov5
from yolotrain.prediction import SourceWarning, predict
from yolotrain.prediction.read_ahead import ReadAhead

FIXTURE_IMAGES = Path(__file__).parent / "fixtures" / "data" / "coco_mini" / "images"


@pytest.fixture(scope="module")
def detector() -> Yolov5:
    return detecting_yolov5n(["a", "b"])


@pytest.fixture
def folder(tmp_path) -> Path:
    """Six real JPEGs, an unreadable one among them, and a PNG."""
    out = tmp_path / "images"
    out.mkdir()
    for path in sorted(FIXTURE_IMAGES.rglob("*.jpg"))[:6]:
        shutil.copy(path, out / path.name)
    (out / "000000000400_broken.jpg").write_bytes(b"not a jpeg")
    cv2.imwrite(str(out / "zz_last.png"), cv2.imread(str(sorted(out.glob("*.jpg"))[0])))
    return out


def test_results_are_those_of_one_image_at_a_time(detector, folder):
    with pytest.warns(SourceWarning, match=r"skipped 1 unreadable source file\(s\):.*000000000400_broken.jpg"):
        together = list(predict(detector, folder, img_size=160, stream=True))
    files = sorted(p for p in folder.iterdir() if "broken" not in p.name)
    assert [Path(r.path) for r in together] == files
    for result, path in zip(together, files):
        (alone,) = predict(detector, path, img_size=160, stream=True)
        assert len(alone.boxes) > 0
        assert torch.equal(result.boxes, alone.boxes) and torch.equal(result.scores, alone.scores)
        assert np.array_equal(result.image, alone.image) and result.orig_shape == alone.orig_shape


def read_ahead_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("yolotrain-read-ahead")]


def test_a_stream_left_early_ends_cleanly(detector, folder):
    stream = predict(detector, folder, img_size=160, stream=True)
    first = next(stream)
    assert read_ahead_threads()  # the next image is being read
    stream.close()  # that read is dropped: nothing hangs or raises, and the thread ends
    assert first.path.endswith(".jpg")
    for thread in read_ahead_threads():
        thread.join(10)
    assert not read_ahead_threads()


def test_the_next_read_starts_before_it_is_asked_for():
    started = {key: threading.Event() for key in range(3)}

    def read(key: int) -> int:
        started[key].set()
        return key * 10

    with ReadAhead(read) as ahead:
        assert ahead.get(0, following=1) == 0
        assert started[1].wait(10)  # read on the thread while the caller still works on 0
        assert ahead.get(1, following=2) == 10
        assert ahead.get(2) == 20


def test_a_read_error_is_raised_when_that_key_is_asked_for():
    def read(key: int) -> int:
        if key == 1:
            raise OSError("disk gone")
        return key

    with ReadAhead(read) as ahead:
        assert ahead.get(0, following=1) == 0  # the failing read ran meanwhile: nothing raised yet
        with pytest.raises(OSError, match="disk gone"):
            ahead.get(1)


def test_leaving_drops_a_read_never_asked_for():
    release = threading.Event()

    def read(key: int) -> int:
        release.wait(10)
        return key

    with ReadAhead(read) as ahead:
        release.set()
        assert ahead.get(0, following=1) == 0
        release.clear()
        assert ahead.get(1, following=2) == 1  # key 2 is still being read when the block is left
    release.set()
    assert ahead._pending == {}
    with pytest.raises(RuntimeError, match="after shutdown"):
        ahead.get(3, following=4)
