"""A moving-shapes video with ground-truth identities, for tracking without a download.

The shapes dataset's circles and rectangles (same drawing, so a model trained on it detects them)
move over its textured background while the camera pans slowly: two cross paths with one passing
in front, one leaves the frame and comes back under the same identity, one is hidden completely for
a while behind another. The folder holds ``shapes.mp4`` and, in MOTChallenge layout, ``shapes/gt/gt.txt``
(``frame, id, x, y, w, h, 1, 1, visibility``; an object is labelled while at least half of it shows)
and ``shapes/seqinfo.ini``, so ``yolotrain track --source DIR/shapes.mp4 --eval DIR`` scores a run.

Run ``python -m yolotrain.data.shapes_video [--root DIR]`` to generate it and print its folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from ..atomic import current_umask
from .cachedir import cache_root
from .shapes import OUTLINE, _background, _hatched_rectangle

VIDEO_VERSION = 1
WIDTH, HEIGHT = 320, 256
FPS = 30
PAN_PX = 0.5  # camera pan per frame (the background slides left)
MIN_VISIBLE = 0.5  # share of an object that must show for it to be labelled
SEQUENCE = "shapes"


@dataclass(frozen=True)
class MovingShape:
    """One object: class (0 circle, 1 rectangle), size, colour, and its centre path in scene pixels as
    (frame, x, y) key points, linear in between; absent outside the first and last key frame."""

    track_id: int
    cls: int
    size: tuple[int, int]
    colour: tuple[int, int, int]
    path: tuple[tuple[int, float, float], ...]

    def centre(self, frame: int) -> tuple[float, float] | None:
        frames = [p[0] for p in self.path]
        if not frames[0] <= frame <= frames[-1]:
            return None
        return (float(np.interp(frame, frames, [p[1] for p in self.path])),
                float(np.interp(frame, frames, [p[2] for p in self.path])))


def scene(frames: int) -> list[MovingShape]:
    """The objects, in drawing order (later ones in front), with paths spread over ``frames`` frames."""
    last = frames - 1

    def at(share: float) -> int:
        return round(share * last)

    return [
        # 1 and 2 cross head-on; 2 passes in front of 1.
        MovingShape(1, 0, (62, 62), (40, 200, 240), ((0, -20, 70), (last, 360, 80))),
        MovingShape(2, 1, (74, 54), (220, 80, 60), ((0, 360, 95), (last, -10, 70))),
        # 3 goes down out of the frame, waits below it and comes back up.
        MovingShape(3, 1, (52, 72), (60, 220, 90), ((0, 250, 120), (at(0.4), 250, 330), (at(0.6), 250, 330),
                                                    (last, 240, 140))),
        # 4 drifts right; 5 passes over it, hiding it completely for a while.
        MovingShape(4, 0, (50, 50), (200, 60, 200), ((0, 60, 200), (last, 130, 200))),
        MovingShape(5, 1, (84, 70), (30, 160, 230), ((at(0.2), 380, 202), (last, -60, 198))),
    ]


def _draw(im: np.ndarray, shape: MovingShape, box: np.ndarray) -> None:
    p1 = tuple(int(v) for v in np.round(box[:2]))
    p2 = tuple(int(v) for v in np.round(box[2:]) - 1)
    if shape.cls == 0:
        centre = ((p1[0] + p2[0]) // 2, (p1[1] + p2[1]) // 2)
        axes = ((p2[0] - p1[0]) // 2, (p2[1] - p1[1]) // 2)
        cv2.ellipse(im, centre, axes, 0, 0, 360, shape.colour, -1, cv2.LINE_AA)
        cv2.ellipse(im, centre, axes, 0, 0, 360, OUTLINE, 2, cv2.LINE_AA)
    else:
        region = im.copy()  # hatching works on a clipped copy; objects may stick out of the frame
        pad = max(WIDTH, HEIGHT)
        canvas = cv2.copyMakeBorder(region, pad, pad, pad, pad, cv2.BORDER_CONSTANT)
        q1, q2 = (p1[0] + pad, p1[1] + pad), (p2[0] + pad, p2[1] + pad)
        _hatched_rectangle(canvas, q1, q2, shape.colour)
        cv2.rectangle(canvas, q1, q2, OUTLINE, 2, cv2.LINE_AA)
        im[...] = canvas[pad:pad + im.shape[0], pad:pad + im.shape[1]]


GroundTruthRow = tuple[int, int, float, float, float, float, float]


def render(frames: int = 150, seed: int = 0) -> tuple[list[np.ndarray], list[GroundTruthRow]]:
    """The BGR frames and ground-truth rows ``(frame (1-based), id, x, y, w, h, visibility)``."""
    rng = np.random.default_rng(seed)
    world = _background(rng, max(WIDTH + int(PAN_PX * frames) + 2, HEIGHT))
    shapes = scene(frames)
    images, rows = [], []
    for f in range(frames):
        pan = PAN_PX * f
        shift = np.float32([[1, 0, -pan], [0, 1, 0]])
        im = cv2.warpAffine(world, shift, (WIDTH, HEIGHT), flags=cv2.INTER_LINEAR)
        masks, boxes = [], []
        for shape in shapes:
            c = shape.centre(f)
            if c is None:
                masks.append(None)
                boxes.append(None)
                continue
            w, h = shape.size
            box = np.array([c[0] - pan - w / 2, c[1] - h / 2, c[0] - pan + w / 2, c[1] + h / 2])
            _draw(im, shape, box)
            mask = np.zeros((HEIGHT, WIDTH), bool)
            x1, x2 = np.clip(np.round(box[[0, 2]]), 0, WIDTH).astype(int)
            y1, y2 = np.clip(np.round(box[[1, 3]]), 0, HEIGHT).astype(int)
            mask[y1:y2, x1:x2] = True
            for earlier in masks:  # what this object covers of those behind it
                if earlier is not None:
                    earlier &= ~mask
            masks.append(mask)
            boxes.append(box)
        for shape, mask, box in zip(shapes, masks, boxes):
            if mask is None:
                continue
            w, h = shape.size
            visible = mask.sum() / (w * h)
            if visible < MIN_VISIBLE:
                continue
            x1, y1 = max(box[0], 0.0), max(box[1], 0.0)
            x2, y2 = min(box[2], WIDTH), min(box[3], HEIGHT)
            rows.append((f + 1, shape.track_id, float(x1), float(y1), float(x2 - x1), float(y2 - y1),
                         round(float(visible), 3)))
        images.append(im)
    return images, rows


def generate_shapes_video(root: str | os.PathLike | None = None, frames: int = 150, seed: int = 0) -> Path:
    """Write (or reuse) the moving-shapes video and its ground truth; returns the folder.

    The folder (default under ``$YOLOTRAIN_CACHE`` or ``~/.cache/yolotrain``, named by the parameters)
    holds ``shapes.mp4``, ``shapes/gt/gt.txt`` and ``shapes/seqinfo.ini``; it is built in a temporary
    folder and renamed into place, and reused when it exists.
    """
    if frames < 2:
        raise ValueError(f"need at least 2 frames, got {frames}")
    parent = Path(root).expanduser() if root is not None else cache_root() / "shapes"
    final = parent / f"shapes-video-v{VIDEO_VERSION}-f{frames}-seed{seed}"
    if (final / SEQUENCE / "seqinfo.ini").is_file():
        return final
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=parent))
    try:
        images, rows = render(frames, seed)
        writer = cv2.VideoWriter(str(tmp / f"{SEQUENCE}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
        for im in images:
            writer.write(im)
        writer.release()
        (tmp / SEQUENCE / "gt").mkdir(parents=True)
        (tmp / SEQUENCE / "gt" / "gt.txt").write_text(
            "".join(f"{f},{i},{x:.2f},{y:.2f},{w:.2f},{h:.2f},1,1,{v}\n" for f, i, x, y, w, h, v in rows))
        (tmp / SEQUENCE / "seqinfo.ini").write_text(
            f"[Sequence]\nname={SEQUENCE}\nframeRate={FPS}\nseqLength={frames}\nimWidth={WIDTH}\n"
            f"imHeight={HEIGHT}\n")
        tmp.chmod(0o777 & ~current_umask())
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / SEQUENCE / "seqinfo.ini").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return final


def main(argv: list[str] | None = None) -> None:
    """Command line entry: generate the video and print its folder."""
    p = argparse.ArgumentParser(prog="python -m yolotrain.data.shapes_video", description=__doc__.splitlines()[0])
    p.add_argument("--root", help="parent folder (default: the yolotrain cache folder)")
    p.add_argument("--frames", type=int, default=150)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print(generate_shapes_video(a.root, a.frames, a.seed))


if __name__ == "__main__":
    main()
