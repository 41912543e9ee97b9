"""What one prediction result offers besides its tensors: a picture (``plot``, ``save``), JSON and a table.

:class:`~yolotrain.prediction.run.Result` (detections, masks), its tracking form and
:class:`~yolotrain.prediction.classify.ClassifyResult` (class probabilities) take these methods from
:class:`ResultOutputs`; each draws itself with its own ``annotate`` and describes itself with its own
``to_dict``, so the picture, the JSON and the table agree with what ``predict`` saves.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from ..draw import draw_detections, draw_keypoints, draw_masks

if TYPE_CHECKING:
    import pandas

# The per-object rows of each result's to_dict(): detections, tracks, or a classifier's top five classes.
_ROW_KEYS = ("detections", "tracks", "top5")


class ResultOutputs(ABC):
    """Base of the prediction results: they hold ``path``, ``frame``, ``image`` and define ``to_dict()``,
    ``annotate()``, ``summary()`` and ``run_summary()``; the rest is built on the first two."""

    path: str
    frame: int | None
    image: np.ndarray | None

    @abstractmethod
    def to_dict(self) -> dict:
        """The result as plain data (what ``predictions.json`` holds for it)."""

    @abstractmethod
    def summary(self) -> str:
        """One line on what was found in this image or frame (``predict --verbose`` prints it)."""

    @classmethod
    @abstractmethod
    def run_summary(cls, results: list) -> str:
        """What ``predict`` prints of a whole run's (non-empty) ``results`` before saying where they are."""

    @abstractmethod
    def annotate(self, image: np.ndarray, *, line_width: int | None = None, hide_labels: bool = False,
                 hide_conf: bool = False) -> np.ndarray:
        """``image`` with the result drawn on it."""

    def plot(self, image: np.ndarray | None = None, *, line_width: int | None = None, hide_labels: bool = False,
             hide_conf: bool = False) -> np.ndarray:
        """The annotated BGR picture ``predict`` saves, as a ``uint8`` array ``[h, w, 3]``.

        It is drawn on ``image`` if given, else on the image the result holds, else on the image file or
        video frame it was predicted from, read again.

        Raises:
            ValueError: none of these is available (a live stream's frame, or an in-memory image whose
                result did not keep it): pass ``image``.
        """
        if image is None:
            image = self.image if self.image is not None else self._read_source()
        return self.annotate(image, line_width=line_width, hide_labels=hide_labels, hide_conf=hide_conf)

    def _read_source(self) -> np.ndarray:
        path = Path(self.path)
        image = None
        if path.is_file():
            if self.frame is None:
                image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            else:
                capture = cv2.VideoCapture(str(path))
                capture.set(cv2.CAP_PROP_POS_FRAMES, self.frame)
                ok, frame = capture.read()
                capture.release()
                image = frame if ok else None
        if image is None:
            where = self.path if self.frame is None else f"{self.path} frame {self.frame}"
            raise ValueError(f"{where}: the image predicted on is not kept and cannot be read again; pass it: "
                             "plot(image=...)")
        return image

    def save(self, path: str | os.PathLike, image: np.ndarray | None = None, **draw_options: Any) -> Path:
        """Write :meth:`plot`'s picture to ``path`` (its suffix chooses the format: ``.jpg``, ``.png`` ...);
        returns the path."""
        path = Path(path)
        annotated = self.plot(image, **draw_options)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            written = cv2.imwrite(str(path), annotated)
        except cv2.error:
            written = False
        if not written:
            raise ValueError(f"{path}: cannot write an image of this format (use .jpg or .png)")
        return path

    def to_json(self) -> str:
        """:meth:`to_dict` as a JSON text: the entry ``predictions.json`` holds for this image or frame."""
        return json.dumps(self.to_dict())

    def to_df(self) -> pandas.DataFrame:
        """One row per detection (``x1 y1 x2 y2 score class name``, with ``polygon`` for masks and ``id`` for
        tracks) or per top-5 class (``class name probability``), each with its ``source`` (and ``frame``).

        Raises:
            ImportError: pandas is not installed.
        """
        try:
            import pandas
        except ImportError:
            raise ImportError("to_df needs pandas: pip install pandas") from None
        described = self.to_dict()
        rows = next(described[key] for key in _ROW_KEYS if key in described)
        where = {"source": described["source"], **({"frame": described["frame"]} if "frame" in described else {})}
        records = []
        for row in rows:
            row = dict(row)
            if "box" in row:
                row.update(zip(("x1", "y1", "x2", "y2"), row.pop("box")))
            records.append({**where, **row})
        return pandas.DataFrame.from_records(records)


class DetectionOutputs(ResultOutputs):
    """The drawing of detection results: masks (segmentation) under the boxes, class names and scores, keypoints
    (pose) over them."""

    boxes: Any
    scores: Any
    classes: Any
    names: list[str]
    masks: np.ndarray | None
    polygons: list[np.ndarray] | None
    keypoints: np.ndarray | None

    def annotate(self, image: np.ndarray, *, line_width: int | None = None, hide_labels: bool = False,
                 hide_conf: bool = False) -> np.ndarray:
        """A copy of the BGR ``image`` with the masks blended in, each box drawn with its label, and a pose
        model's keypoints on top."""
        if self.masks is not None:
            image = draw_masks(image, self.masks, self.classes)
        # Rotated boxes are drawn as their corners' polygons (a mask's outline is drawn as its box).
        outlines = self.polygons if getattr(self, "rotated", None) is not None else None
        image = draw_detections(image, self.boxes, self.classes, self.names, self.scores, line_width=line_width,
                                hide_labels=hide_labels, hide_conf=hide_conf, outlines=outlines)
        return image if self.keypoints is None else draw_keypoints(image, self.keypoints)
