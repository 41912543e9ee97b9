"""Prediction options (crops, drawing, video stride) and live sources: an MJPEG stream served from
127.0.0.1, the newest-frame reader, streams that cannot be opened and Ctrl-C on a running stream."""

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from yolotrain import Yolov5
from yolotrain.checkpoint import save_checkpoint
from yolotrain.cli import main
from yolotrain.draw import draw_detections
from yolotrain.prediction import predict
from yolotrain.prediction.streams import LatestFrameReader, is_stream

# A random-init model scores every anchor at ~0.007: this threshold gives a handful of detections.
LOW_CONF = dict(conf=0.001, max_det=6, img_size=128, device="cpu")
FRAME_SHAPE = (64, 96)
LEVEL_STEP = 8  # stream frame i is a flat grey image of level i * LEVEL_STEP


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2).eval()
    model.names = ["circle", "rectangle"]
    return model


@pytest.fixture(scope="module")
def tiny_weights(tiny_model, tmp_path_factory) -> Path:
    return save_checkpoint(tmp_path_factory.mktemp("weights") / "tiny", tiny_model)


def gradient_image(h: int = 96, w: int = 128) -> np.ndarray:
    """A smooth BGR image: JPEG keeps it almost exactly, so saved crops can be compared with it."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack(((x * 2) % 256, (y * 2) % 256, ((x + y) % 256)), -1).astype(np.uint8)


def frame_level(frame: np.ndarray) -> int:
    return round(float(frame.mean()) / LEVEL_STEP)


class MjpegServer:
    """Serves ``/stream`` as multipart MJPEG (what IP cameras send): ``frames`` frames (None: endless)
    ``interval`` seconds apart, frame i a flat grey of level ``i * LEVEL_STEP``."""

    def __init__(self, frames: int | None, interval: float) -> None:
        self.frames, self.interval = frames, interval
        self.clients_done = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
                self.end_headers()
                i = 0
                try:
                    while server.frames is None or i < server.frames:
                        level = (i * LEVEL_STEP) % 256 if server.frames is None else i * LEVEL_STEP
                        jpg = cv2.imencode(".jpg", np.full((*FRAME_SHAPE, 3), level, np.uint8))[1].tobytes()
                        self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n%s\r\n"
                                         % (len(jpg), jpg))
                        i += 1
                        time.sleep(server.interval)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    server.clients_done.set()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/stream"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def mjpeg_server():
    servers = []

    def start(frames: int | None = 20, interval: float = 0.02) -> MjpegServer:
        servers.append(MjpegServer(frames, interval))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def write_video(path: Path, n: int) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, FRAME_SHAPE[::-1])
    for i in range(n):
        writer.write(np.full((*FRAME_SHAPE, 3), i * 20, np.uint8))
    writer.release()


def video_frame_count(path: Path) -> int:
    cap = cv2.VideoCapture(str(path))
    count = 0
    while cap.read()[0]:
        count += 1
    cap.release()
    return count


# Drawing options


def test_draw_options_change_what_is_drawn():
    black = np.zeros((200, 200, 3), np.uint8)
    box, cls, score = [[50, 80, 150, 160]], [0], [0.9]
    default = draw_detections(black, box, cls, ["thing"], score)
    no_labels = draw_detections(black, box, cls, ["thing"], score, hide_labels=True)
    no_conf = draw_detections(black, box, cls, ["thing"], score, hide_conf=True)
    band = (slice(55, 78), slice(52, 200))  # where the label sits, above the box
    assert default[band].any() and not no_labels[band].any()
    assert no_labels[80, 100].any() and no_labels[120, 50].any()  # the box itself is still drawn
    # Without the score the label is narrower, and equal to a label drawn without scores at all.
    assert 0 < np.count_nonzero(no_conf[band]) < np.count_nonzero(default[band])
    assert np.array_equal(no_conf, draw_detections(black, box, cls, ["thing"]))
    thin = draw_detections(black, box, cls, ["thing"], hide_labels=True, line_width=1)
    thick = draw_detections(black, box, cls, ["thing"], hide_labels=True, line_width=9)
    assert thick[120, 54].any() and not thin[120, 54].any()  # 4 px inside the left edge
    assert np.count_nonzero(thick) > 4 * np.count_nonzero(thin)
    with pytest.raises(ValueError, match="line_width"):
        draw_detections(black, box, cls, ["thing"], line_width=0)


def test_saved_images_follow_the_drawing_options(tiny_model, tmp_path):
    image = gradient_image()
    cv2.imwrite(str(tmp_path / "in.png"), image)
    (plain,) = predict(tiny_model, tmp_path / "in.png", save_dir=tmp_path / "plain", **LOW_CONF)
    (result,) = predict(tiny_model, tmp_path / "in.png", save_dir=tmp_path / "styled", hide_labels=True,
                        line_width=1, **LOW_CONF)
    assert len(result.scores) > 0
    styled = cv2.imread(str(tmp_path / "styled" / "in.png"))
    expected = draw_detections(image, result.boxes, result.classes, result.names, result.scores,
                               hide_labels=True, line_width=1)
    assert np.array_equal(styled, expected)  # PNG: exactly what draw_detections drew
    assert not np.array_equal(styled, cv2.imread(str(tmp_path / "plain" / "in.png")))


# Crops


def test_save_crop_writes_each_detection_cut_from_the_original(tiny_model, tmp_path):
    image = gradient_image()
    cv2.imwrite(str(tmp_path / "scene.png"), image)
    (result,) = predict(tiny_model, tmp_path / "scene.png", save_dir=tmp_path / "out", save_crop=True, **LOW_CONF)
    crops = tmp_path / "out" / "crops"
    by_class: dict[str, list[Path]] = {}
    for c in result.classes.tolist():
        by_class.setdefault(result.names[c], [])
    for name in by_class:
        by_class[name] = sorted((crops / name).glob("*.jpg"), key=lambda p: (len(p.name), p.name))
    counts = torch.bincount(result.classes, minlength=2).tolist()
    assert {name: len(files) for name, files in by_class.items()} == {
        result.names[c]: n for c, n in enumerate(counts) if n}
    for files in by_class.values():  # scene.jpg, scene2.jpg, scene3.jpg ... in detection order
        assert [f.name for f in files] == ["scene.jpg"] + [f"scene{i}.jpg" for i in range(2, len(files) + 1)]
    assert sorted(p.name for p in crops.iterdir()) == sorted(by_class)
    # Each crop is its box cut from the original (not the annotated) image.
    for name, files in by_class.items():
        boxes = [b for b, c in zip(result.boxes.tolist(), result.classes.tolist()) if result.names[c] == name]
        for file, (x1, y1, x2, y2) in zip(files, boxes):
            top, left = max(int(np.floor(y1)), 0), max(int(np.floor(x1)), 0)
            region = image[top:min(int(np.ceil(y2)), 96), left:min(int(np.ceil(x2)), 128)]
            crop = cv2.imread(str(file))
            assert crop.shape == region.shape
            assert np.abs(crop.astype(int) - region).mean() < 3  # JPEG noise only, no drawn lines
    assert not (tmp_path / "plain").exists()
    predict(tiny_model, tmp_path / "scene.png", save_dir=tmp_path / "plain", **LOW_CONF)
    assert not (tmp_path / "plain" / "crops").exists()


# Videos


def test_vid_stride_predicts_every_nth_frame(tiny_model, tmp_path):
    video = tmp_path / "clip.mp4"
    write_video(video, 10)
    every = predict(tiny_model, video, save_dir=tmp_path / "all", **LOW_CONF)
    strided = predict(tiny_model, video, save_dir=tmp_path / "third", save_txt=True, vid_stride=3, **LOW_CONF)
    assert [r.frame for r in every] == list(range(10))
    assert [r.frame for r in strided] == [0, 3, 6, 9]
    for a, b in zip(strided, every[::3]):  # the same frames as without a stride
        torch.testing.assert_close(a.boxes, b.boxes)
    assert video_frame_count(tmp_path / "third" / "clip.mp4") == 4
    assert video_frame_count(tmp_path / "all" / "clip.mp4") == 10
    assert sorted(p.name for p in (tmp_path / "third" / "labels").iterdir()) == [
        "clip_0.txt", "clip_3.txt", "clip_6.txt", "clip_9.txt"]
    with pytest.raises(ValueError, match="vid_stride"):
        predict(tiny_model, video, vid_stride=0, **LOW_CONF)


# Live sources


def test_stream_sources_are_recognised():
    assert all(is_stream(s) for s in (0, 1, "0", "1", "rtsp://h/x", "RTMP://h/x", "http://h/x", "https://h/x"))
    assert not any(is_stream(s) for s in ("image.jpg", "videos/", "file://x", -1, True, np.zeros(3)))


def test_reader_keeps_only_the_newest_frame(mjpeg_server):
    server = mjpeg_server(frames=30, interval=0.01)
    seen = []
    with LatestFrameReader(server.url) as reader:
        for index, frame in reader:
            assert frame.shape == (*FRAME_SHAPE, 3) and frame_level(frame) == index  # the frame it says it is
            seen.append(index)
            time.sleep(0.08)  # a slow consumer: frames arriving meanwhile replace each other
    assert seen == sorted(set(seen)) and 2 <= len(seen) < 20
    assert max(np.diff(seen)) > 1 and seen[-1] >= 25  # skipped the backlog, kept up with the stream
    assert not reader.running


def test_reader_vid_stride_and_close_on_an_endless_stream(mjpeg_server):
    server = mjpeg_server(frames=None, interval=0.01)
    reader = LatestFrameReader(server.url, vid_stride=4)
    indices = []
    for index, _ in reader:
        indices.append(index)
        if len(indices) == 3:
            break
    assert all(i % 4 == 0 for i in indices)
    reader.close()
    assert not reader.running
    assert server.clients_done.wait(5)  # the connection was closed


def test_predict_on_a_stream_saves_video_and_labels(tiny_model, mjpeg_server, tmp_path):
    server = mjpeg_server(frames=20, interval=0.03)
    results = predict(tiny_model, server.url, save_dir=tmp_path / "out", save_txt=True, **LOW_CONF)
    frames = [r.frame for r in results]
    assert results and frames == sorted(set(frames)) and frames[-1] < 20
    assert all(r.path == server.url and r.orig_shape == FRAME_SHAPE for r in results)
    assert video_frame_count(tmp_path / "out" / "stream0.mp4") == len(results)
    assert len(list((tmp_path / "out" / "labels").glob("stream0_*.txt"))) == len(results)
    assert len(json.loads((tmp_path / "out" / "predictions.json").read_text())) == len(results)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("scheme", ["rtsp", "http"])
def test_stream_that_cannot_be_opened_gets_one_line(tiny_weights, tmp_path, capsys, scheme):
    url = f"{scheme}://127.0.0.1:{_closed_port()}/live"
    code = main(["predict", "--weights", str(tiny_weights), "--source", url, "--device", "cpu",
                 "--project", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 1 and err.strip().splitlines()[-1] == f"yolotrain predict: error: cannot open stream {url}"
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_stops_a_stream_and_saves_results(tiny_weights, mjpeg_server, tmp_path):
    server = mjpeg_server(frames=None, interval=0.02)
    run = tmp_path / "runs" / "exp"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "yolotrain", "predict", "--weights", str(tiny_weights), "--source", server.url,
         "--img", "64", "--device", "cpu", "--save-txt", "--project", str(tmp_path / "runs")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "stream0.mp4").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # a few more frames
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    saved = json.loads((run / "predictions.json").read_text())
    assert saved and f"{len(saved)} images/frames" in out
    assert video_frame_count(run / "stream0.mp4") == len(saved)  # the writer was released: a playable file
    assert len(list((run / "labels").glob("stream0_*.txt"))) == len(saved)
    assert server.clients_done.wait(10)  # the reading thread stopped and closed the connection


@pytest.mark.skipif(Path("/dev/video0").exists(), reason="a camera is attached")
def test_camera_index_without_a_camera_gets_one_line(tiny_model):
    with pytest.raises(ValueError, match="^cannot open stream 0$"):
        predict(tiny_model, "0", **LOW_CONF)
