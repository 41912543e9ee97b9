"""A classifier's predictions: :class:`ClassifyResult` (class probabilities of one image or frame, drawn and
written as the reference's ``classify/predict.py`` does) and :class:`ClassifyPredictor` (the reference's
evaluation transform and a softmax per image)."""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np
import torch

from ..data.classify import eval_transform
from ..detector import Detector
from ..draw import class_colour
from ..eval.classify import TOP_K
from .result_outputs import ResultOutputs


@dataclass
class ClassifyResult(ResultOutputs):
    """Class probabilities of one image or video frame: ``probs`` ``[nc]`` (softmax), ``top5`` the indices of
    the five most probable classes (fewer with fewer classes), best first. ``image`` is the BGR image or
    frame classified, on the results of ``predict(stream=True)`` only, as for detections. ``plot()``,
    ``save(path)``, ``to_json()`` and ``to_df()`` come from :class:`ResultOutputs`."""

    path: str
    probs: torch.Tensor
    names: list[str]
    orig_shape: tuple[int, int]
    frame: int | None = None
    image: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def top5(self) -> list[int]:
        return self.probs.topk(min(TOP_K, len(self.probs))).indices.tolist()

    @property
    def top1(self) -> int:
        return int(self.probs.argmax())

    def lines(self) -> list[str]:
        """``probability name`` of the top five classes, as the reference's ``classify/predict.py`` saves them."""
        return [f"{float(self.probs[i]):.2f} {self.names[i]}" for i in self.top5]

    yolo_lines = lines  # the label file of each image, as detection results write theirs

    def summary(self) -> str:
        """One line: the source and its top five classes with their probabilities."""
        return f"{self.path}: " + ", ".join(f"{self.names[i]} {float(self.probs[i]):.2f}" for i in self.top5)

    @classmethod
    def run_summary(cls, results: list[ClassifyResult]) -> str:
        """Each image's top five, then how many were classified."""
        return "\n".join([*(r.summary() for r in results), f"{len(results)} images/frames classified."])

    def to_dict(self) -> dict:
        out = {"source": self.path, "height": self.orig_shape[0], "width": self.orig_shape[1],
               "top5": [{"class": i, "name": self.names[i], "probability": round(float(self.probs[i]), 5)}
                        for i in self.top5]}
        if self.frame is not None:
            out["frame"] = self.frame
        return out

    def annotate(self, image: np.ndarray, *, line_width: int | None = None, hide_labels: bool = False,
                 hide_conf: bool = False) -> np.ndarray:
        """A copy of the BGR ``image`` with the top five classes (and probabilities) written at its top left."""
        out = np.ascontiguousarray(image).copy()
        if hide_labels:
            return out
        h, w = out.shape[:2]
        thickness = line_width or max(round((h + w) / 2 * 0.003), 2)
        scale, font = thickness / 3, cv2.FONT_HERSHEY_SIMPLEX
        y = 0
        for i in self.top5:
            text = self.names[i] if hide_conf else f"{float(self.probs[i]):.2f} {self.names[i]}"
            (tw, th), baseline = cv2.getTextSize(text, font, scale, max(thickness - 1, 1))
            cv2.rectangle(out, (0, y), (tw + 4, y + th + baseline + 4), class_colour(i), -1)
            cv2.putText(out, text, (2, y + th + 2), font, scale, (255, 255, 255), max(thickness - 1, 1), cv2.LINE_AA)
            y += th + baseline + 4
        return out


class ClassifyPredictor:
    """A classifier ready for inference with its input size; :meth:`predict_image` per BGR image (the
    reference's evaluation transform: centre crop, ImageNet normalisation)."""

    def __init__(self, model: Detector, device: torch.device, img_size: int | None = None) -> None:
        self.model, self.device = model, device
        self.names = list(model.names)
        self.img_size = img_size or model.default_img_size
        self.dtype = model.dtype

    def decode_scale(self, orig_shape: tuple[int, int]) -> float:
        """How large an image of ``orig_shape`` (h, w) is used relative to its size: its short side at ``img_size``."""
        return self.img_size / min(orig_shape)

    def predict_image(self, image: np.ndarray, path: str = "", frame: int | None = None,
                      orig_shape: tuple[int, int] | None = None) -> ClassifyResult:
        """The class probabilities of one BGR image; with ``orig_shape`` (h, w), ``image`` is a reduced decode of an
        image of that size, which the result names as its size and does not keep."""
        x = eval_transform(image, self.img_size)[None].to(self.device, self.dtype)
        with torch.inference_mode():
            probs = self.model(x).float().softmax(1)[0].cpu()
        return ClassifyResult(path, probs, self.names, orig_shape or tuple(image.shape[:2]), frame,
                              None if orig_shape else image)
