"""``predict`` over image files reads the next still on a thread while the current one is predicted, and on a CPU
with two PyTorch threads or more reads and predicts two side by side, each on its share of the threads: the next
read really starts before it is asked for, the two forward passes really overlap, results and their order are
those of one image at a time, unreadable files are still skipped and counted, and a read's error or an early end
of the stream leaves nothing behind."""

import contextlib
import shutil
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import detecting_yolov5n

from yolotrain.model import Yolov5
from yolotrain.prediction import SourceWarning, predict
from yolotrain.prediction.read_ahead import ReadAhead, forward_thread_shares, in_order

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


@contextlib.contextmanager
def torch_threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_results_are_those_of_one_image_at_a_time(detector, folder):
    # One thread: the read-ahead alone (with more, a folder's forward passes run side by side on fewer threads
    # each than a single file's, which float32 convolutions may round differently).
    skipped = r"skipped 1 unreadable source file\(s\):.*000000000400_broken.jpg"
    with torch_threads(1), pytest.warns(SourceWarning, match=skipped):
        together = list(predict(detector, folder, img_size=160, stream=True))
    files = sorted(p for p in folder.iterdir() if "broken" not in p.name)
    assert [Path(r.path) for r in together] == files
    for result, path in zip(together, files):
        with torch_threads(1):
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
        assert ahead.get(0, following=[1]) == 0
        assert started[1].wait(10)  # read on the thread while the caller still works on 0
        assert ahead.get(1, following=[2]) == 10
        assert ahead.get(2) == 20


def test_a_read_error_is_raised_when_that_key_is_asked_for():
    def read(key: int) -> int:
        if key == 1:
            raise OSError("disk gone")
        return key

    with ReadAhead(read) as ahead:
        assert ahead.get(0, following=[1]) == 0  # the failing read ran meanwhile: nothing raised yet
        with pytest.raises(OSError, match="disk gone"):
            ahead.get(1)


def test_leaving_drops_a_read_never_asked_for():
    release = threading.Event()

    def read(key: int) -> int:
        release.wait(10)
        return key

    with ReadAhead(read) as ahead:
        release.set()
        assert ahead.get(0, following=[1]) == 0
        release.clear()
        assert ahead.get(1, following=[2]) == 1  # key 2 is still being read when the block is left
    release.set()
    assert ahead._pending == {}
    with pytest.raises(RuntimeError, match="after shutdown"):
        ahead.get(3, following=[4])


def test_two_threads_split_between_two_forward_passes():
    assert forward_thread_shares(2, 5, side_by_side=True) == [1, 1]
    assert forward_thread_shares(3, 5, side_by_side=True) == [2, 1]
    assert forward_thread_shares(8, 2, side_by_side=True) == [4, 4]
    assert forward_thread_shares(1, 5, side_by_side=True) == []  # one thread: the read-ahead only
    assert forward_thread_shares(4, 1, side_by_side=True) == []  # a single image keeps every thread
    assert forward_thread_shares(4, 5, side_by_side=False) == []


def forward_calls(detector: Yolov5) -> tuple[list[tuple[str, int]], threading.Barrier, object]:
    """Each forward pass's thread name and PyTorch thread count; the first two wait for each other (a barrier that
    breaks after 10 s if they run one after the other)."""
    calls: list[tuple[str, int]] = []
    first_two = threading.Barrier(2, timeout=10)

    def record(module, inputs):
        calls.append((threading.current_thread().name, torch.get_num_threads()))
        if len(calls) <= 2:
            first_two.wait()

    return calls, first_two, detector.register_forward_pre_hook(record)


def test_two_stills_are_predicted_side_by_side_each_on_one_thread(folder):
    detector = detecting_yolov5n(["a", "b"])  # its own: the hook is copied into its inference copy
    calls, first_two, hook = forward_calls(detector)
    with torch_threads(2), pytest.warns(SourceWarning, match="skipped 1 unreadable"):
        side_by_side = predict(detector, folder, img_size=160, half=False)
        assert torch.get_num_threads() == 2  # the caller's own count is untouched
    hook.remove()
    assert not first_two.broken  # the first two forward passes ran at the same time
    assert len(calls) == len(side_by_side) == 7
    assert {name.split("_")[0] for name, _ in calls} == {"yolotrain-read-ahead"}
    assert {threads for _, threads in calls} == {1}
    # The same results, in the same order, as one image at a time on one thread (the count each pass had).
    with torch_threads(1), pytest.warns(SourceWarning, match="skipped 1 unreadable"):
        one_at_a_time = predict(detector, folder, img_size=160, half=False)
    assert [r.path for r in side_by_side] == [r.path for r in one_at_a_time]
    for a, b in zip(side_by_side, one_at_a_time):
        assert torch.equal(a.boxes, b.boxes) and torch.equal(a.scores, b.scores) and torch.equal(a.classes, b.classes)


def test_arrays_are_predicted_side_by_side_under_their_names(detector, folder):
    images = [cv2.imread(str(p)) for p in sorted(folder.glob("*.jpg")) if "broken" not in p.name][:3]
    with torch_threads(2):
        results = predict(detector, images, img_size=160, half=False)
    with torch_threads(1):
        alone = [predict(detector, image, img_size=160, half=False)[0] for image in images]
    assert [r.path for r in results] == ["image0.jpg", "image1.jpg", "image2.jpg"]
    assert all(torch.equal(a.boxes, b.boxes) for a, b in zip(results, alone))


@pytest.mark.parametrize("option", ["visualize", "augment"])
def test_a_hooked_or_wrapped_model_is_predicted_one_image_at_a_time(tmp_path, folder, option):
    """--visualize saves each forward pass's feature maps in turn, and --augment wraps the model in its own batch of
    scales: their passes stay on the caller's thread."""
    detector = detecting_yolov5n(["a", "b"])
    calls: list[str] = []
    hook = detector.register_forward_pre_hook(lambda m, i: calls.append(threading.current_thread().name))
    with torch_threads(2), pytest.warns(SourceWarning, match="skipped 1 unreadable"):
        predict(detector, folder, img_size=160, save_dir=tmp_path / "run", **{option: True})
    hook.remove()
    assert calls and set(calls) == {threading.main_thread().name}


@pytest.fixture
def video(tmp_path, folder) -> Path:
    """Six frames made of the real JPEGs."""
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (320, 240))
    for image in sorted(folder.glob("*.jpg")):
        if "broken" not in image.name:
            writer.write(cv2.resize(cv2.imread(str(image)), (320, 240)))
    writer.release()
    return path


def test_a_video_files_frames_are_predicted_side_by_side_in_order(video, tmp_path):
    detector = detecting_yolov5n(["a", "b"])
    calls, first_two, hook = forward_calls(detector)
    with torch_threads(2):
        side_by_side = predict(detector, video, img_size=160, half=False, save_dir=tmp_path / "two")
    hook.remove()
    assert not first_two.broken and len(calls) == 6
    assert {threads for _, threads in calls} == {1} and all(name != "MainThread" for name, _ in calls)
    with torch_threads(1):
        one_at_a_time = predict(detector, video, img_size=160, half=False, save_dir=tmp_path / "one")
    assert [r.frame for r in side_by_side] == [r.frame for r in one_at_a_time] == list(range(6))
    assert sum(len(r.boxes) for r in side_by_side) > 0
    for a, b in zip(side_by_side, one_at_a_time):
        assert torch.equal(a.boxes, b.boxes) and torch.equal(a.scores, b.scores)
    for run in ("two", "one"):  # the annotated video holds every frame
        cap = cv2.VideoCapture(str(tmp_path / run / "clip.mp4"))
        assert cap.get(cv2.CAP_PROP_FRAME_COUNT) == 6
        cap.release()


def test_a_video_stream_left_early_ends_its_threads_and_its_video(video, tmp_path):
    with torch_threads(2):
        stream = predict(detecting_yolov5n(["a", "b"]), video, img_size=160, stream=True, save_dir=tmp_path / "run")
        assert next(stream).frame == 0
        stream.close()
    for thread in read_ahead_threads():
        thread.join(10)
    assert not read_ahead_threads()
    cap = cv2.VideoCapture(str(tmp_path / "run" / "clip.mp4"))  # finalised with the frame given
    assert cap.isOpened() and cap.get(cv2.CAP_PROP_FRAME_COUNT) == 1
    cap.release()


def test_in_order_gives_results_in_item_order_whatever_finishes_first():
    def work(item: float) -> float:
        time.sleep(item)  # the first item finishes last
        return item * 2

    assert list(in_order(work, [0.2, 0.0, 0.1, 0.0], [1, 1])) == [(0.2, 0.4), (0.0, 0.0), (0.1, 0.2), (0.0, 0.0)]


def test_in_order_raises_an_items_error_at_its_turn_and_drops_the_rest():
    started: list[int] = []

    def work(item: int) -> int:
        started.append(item)
        if item == 1:
            raise ValueError("frame 1 broken")
        return item

    results = in_order(work, range(100), [1, 1])
    assert next(results) == (0, 0)
    with pytest.raises(ValueError, match="frame 1 broken"):
        next(results)
    assert len(started) < 10  # at most the items in flight were started, not the hundred


def test_in_order_left_early_starts_nothing_more():
    gate = threading.Event()
    started: list[int] = []

    def work(item: int) -> int:
        started.append(item)
        gate.wait(10)
        return item

    results = in_order(work, range(100), [1, 1])
    gate.set()
    assert next(results) == (0, 0)
    results.close()
    time.sleep(0.2)
    assert len(started) <= 4  # the two threads' items and the one queued behind them
