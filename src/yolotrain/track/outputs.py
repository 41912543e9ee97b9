"""What a tracking run saves per sequence (a video, a stream, or a folder of frames): the annotated
video (or images) with each track's id and recent path, MOTChallenge rows, a JSON of every frame's
tracks, and on request YOLO-format labels with ids and crops per id."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict, deque
from pathlib import Path

import cv2
import numpy as np

from ..draw import class_colour, draw_detections, draw_keypoints
from ..prediction.run import _show
from .result import TrackResult

MOT_FOLDER = "mot"  # MOTChallenge files, one per sequence: what --eval scores


class SequenceOutputs:
    """The files of one sequence, written frame by frame (MOT rows flushed at once, so an interrupted
    stream keeps every frame tracked); :meth:`close` finishes the video and writes the JSON."""

    def __init__(self, save_dir: Path | None, name: str, *, video: bool, fps: float, save_media: bool,
                 save_txt: bool, save_crop: bool, view: bool, trail: int, draw_options: dict) -> None:
        self.save_dir, self.name, self.video, self.fps = save_dir, name, video, fps
        self.save_media = save_media and save_dir is not None
        self.save_txt = save_txt and save_dir is not None
        self.save_crop = save_crop and save_dir is not None
        self.view, self.draw_options = view, draw_options
        self.trails: dict[int, deque[tuple[int, int]]] = defaultdict(lambda: deque(maxlen=trail))
        self.trail = trail
        self.frames: list[dict] = []
        self.frame_count = 0
        self._writer: cv2.VideoWriter | None = None
        self._mot = None
        if save_dir is not None:
            (save_dir / MOT_FOLDER).mkdir(parents=True, exist_ok=True)
            self._mot = open(save_dir / MOT_FOLDER / f"{name}.txt", "w")
            if self.save_txt:
                (save_dir / "labels").mkdir(exist_ok=True)

    def add(self, result: TrackResult, image: np.ndarray | None) -> None:
        self.frame_count += 1
        self.frames.append(result.to_dict())
        if self._mot is not None:
            self._mot.writelines(f"{line}\n" for line in result.mot_lines())
            self._mot.flush()
        for box, track_id in zip(result.boxes.tolist(), result.ids.tolist()):
            self.trails[track_id].append((round((box[0] + box[2]) / 2), round((box[1] + box[3]) / 2)))
        if image is None:
            return
        if self.save_media or self.view:
            annotated = self.draw(image, result)
            if self.view:
                _show(result.path, annotated)
            if self.save_media:
                self._save_media(result, annotated)
        stem = f"{self.name}_{result.mot_frame}"
        if self.save_txt:
            (self.save_dir / "labels" / f"{stem}.txt").write_text("".join(f"{r}\n" for r in result.yolo_lines()))
        if self.save_crop:
            self._crops(result, image)

    def draw(self, image: np.ndarray, result: TrackResult) -> np.ndarray:
        """Boxes labelled ``#ID class score`` in one colour per id, each with its last ``trail`` centres, and a
        pose model's keypoints on top (as predict draws them)."""
        ids = result.ids.tolist()
        labels = [""] * (max(ids, default=-1) + 1)  # draw_detections colours and names by this index: the id
        for track_id, c in zip(ids, result.classes.tolist()):
            labels[track_id] = f"#{track_id} {result.names[c]}"
        out = draw_detections(image, result.boxes, result.ids, labels, result.scores, **self.draw_options)
        thickness = max((self.draw_options.get("line_width") or max(round(sum(image.shape[:2]) / 2 * 0.003), 2)) - 1, 1)
        for track_id in ids:
            points = self.trails[track_id]
            if self.trail and len(points) > 1:
                cv2.polylines(out, [np.array(points, np.int32)], False, class_colour(track_id), thickness, cv2.LINE_AA)
        return out if result.keypoints is None else draw_keypoints(out, result.keypoints)

    def _save_media(self, result: TrackResult, annotated: np.ndarray) -> None:
        if not self.video:  # frames from a folder: annotated images of the same names
            folder = self.save_dir / self.name
            folder.mkdir(exist_ok=True)
            cv2.imwrite(str(folder / Path(result.path).name), annotated)
            return
        if self._writer is None:
            h, w = annotated.shape[:2]
            self._writer = cv2.VideoWriter(str(self.save_dir / f"{self.name}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"),
                                           self.fps, (w, h))
        self._writer.write(annotated)

    def _crops(self, result: TrackResult, image: np.ndarray) -> None:
        """Each track's box as ``crops/SEQUENCE/ID/FRAME.jpg``."""
        h, w = image.shape[:2]
        for (x1, y1, x2, y2), track_id in zip(result.boxes.tolist(), result.ids.tolist()):
            left, top = max(math.floor(x1), 0), max(math.floor(y1), 0)
            right, bottom = min(math.ceil(x2), w), min(math.ceil(y2), h)
            if right <= left or bottom <= top:
                continue
            folder = self.save_dir / "crops" / self.name.replace(os.sep, "_") / str(track_id)
            folder.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(folder / f"{result.mot_frame}.jpg"), image[top:bottom, left:right])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None
        if self._mot is not None:
            self._mot.close()
            self._mot = None
            (self.save_dir / f"{self.name}.json").write_text(json.dumps({"sequence": self.name,
                                                                          "frames": self.frames}))
