"""Tracking cost: the trackers' own time per frame against ultralytics 8's on the same detections, and
frames/s of ``predict`` and ``track`` (ByteTrack, BoT-SORT) on a 640 px video.

Tracker rows: the oracle test's recorded sequence (``tests/fixtures/track/detections.json``, 150
frames, 5-10 detections each) fed to ours and to ultralytics' ``BYTETracker`` / ``BOTSORT``, passes
alternated, median ms per frame; BoT-SORT's camera-motion compensation runs on 640x512 frames (the
shapes video scaled 2x), which it dominates. Video rows: yolov5n (the official weights from ../shared,
else random weights: the speed is the same) on the shapes video scaled to 640x512, nothing saved.

    PYTHONPATH=src python benchmarks/bench_track.py [--rounds 5] [--frames 60] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import torch
from common import ROOT, YOLOV5N, reference_env

from yolotrain.data.shapes_video import render
from yolotrain.prediction import predict
from yolotrain.track import make_tracker, tracker_config
from yolotrain.track.run import track

RESULTS = Path(__file__).resolve().parent / "results" / "track.json"
FIXTURE = ROOT / "tests" / "fixtures" / "track" / "detections.json"
SCALE = 2  # the shapes video (320x256) scaled to 640x512


def _ultralytics():
    os.environ.update(reference_env(tempfile.mkdtemp(prefix="ultralytics-")))
    from ultralytics.engine.results import Boxes
    from ultralytics.trackers.bot_sort import BOTSORT
    from ultralytics.trackers.byte_tracker import BYTETracker

    return {"bytetrack": BYTETracker, "botsort": BOTSORT}, Boxes


def tracker_rows(rounds: int) -> dict:
    classes, boxes_type = _ultralytics()
    scale = np.array([SCALE] * 4 + [1, 1], np.float32)  # boxes to the 640 px frames; scores, classes kept
    detections = [np.array(f, np.float32).reshape(-1, 6) * scale for f in json.loads(FIXTURE.read_text())["frames"]]
    frames = [cv2.resize(im, None, fx=SCALE, fy=SCALE) for im in render(len(detections))[0]]
    rows = {}
    for name in ("bytetrack", "botsort"):
        config = tracker_config(name)
        times: dict[str, list[float]] = {"ours": [], "ultralytics": []}
        for _ in range(rounds):
            for who in times:
                tracker = make_tracker(config) if who == "ours" else \
                    classes[name](SimpleNamespace(**vars(config), model="auto"))
                start = time.perf_counter()
                for dets, image in zip(detections, frames):
                    if who == "ours":
                        tracker.update(dets[:, :4], dets[:, 4], dets[:, 5], image)
                    else:
                        tracker.update(boxes_type(dets, image.shape[:2]), image)
                times[who].append((time.perf_counter() - start) / len(detections) * 1000)
        rows[name] = {f"{who}_ms_per_frame": statistics.median(t) for who, t in times.items()}
        rows[name]["ours_over_ultralytics"] = rows[name]["ours_ms_per_frame"] / rows[name]["ultralytics_ms_per_frame"]
    return rows


def video_rows(frames: int, rounds: int, device: str) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="bench-track-"))
    video = folder / "shapes640.mp4"
    images = [cv2.resize(im, None, fx=SCALE, fy=SCALE) for im in render(frames)[0]]
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 30, images[0].shape[1::-1])
    for im in images:
        writer.write(im)
    writer.release()
    weights = str(YOLOV5N) if YOLOV5N.is_file() else "yolov5n"
    runs = {
        "predict": lambda: predict(weights, video, img_size=640, device=device, conf=0.1, stream=True),
        "track_bytetrack": lambda: track(weights, video, "bytetrack", img_size=640, device=device, stream=True),
        "track_botsort": lambda: track(weights, video, "botsort", img_size=640, device=device, stream=True),
    }
    fps: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            results = run()
            next(results)  # model loaded and warm: time the frames after the first
            start = time.perf_counter()
            count = sum(1 for _ in results)
            fps[name].append(count / (time.perf_counter() - start))
    out = {f"{name}_frames_per_s": statistics.median(v) for name, v in fps.items()}
    out["weights"] = "yolov5n.pt" if YOLOV5N.is_file() else "yolov5n (random weights)"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--frames", type=int, default=60)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=str(RESULTS))
    a = p.parse_args()
    load_before = os.getloadavg()[0]
    result = {
        "setup": {"frame_size": [256 * SCALE, 320 * SCALE], "img_size": 640, "device": a.device, "rounds": a.rounds,
                  "video_frames": a.frames, "torch_threads": torch.get_num_threads(), "cpu": platform.machine(),
                  "torch": torch.__version__, "load_average_1min_at_start": load_before},
        "tracker": tracker_rows(a.rounds),
        "video": video_rows(a.frames, max(a.rounds // 2, 1), a.device),
    }
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
