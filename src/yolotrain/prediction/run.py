"""Prediction on images, videos, cameras and network streams: letterbox, detect, NMS, map boxes back
to each original image, and optionally save annotated images/videos, YOLO-format ``.txt`` labels,
crops of the detections and a JSON of the run."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import re
import signal
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import cv2
import numpy as np
import torch
from tqdm import tqdm

from ..boxes import check_image_size, letterbox_geometry
from ..callbacks import Callbacks, CallbackSpec, as_callbacks
from ..data.augment import letterbox
from ..data.dataset import JPEG_SUFFIXES, decode_flag, decoded_size, reduction_factor
from ..data.loaders import REDUCED_DECODE_HELP, DataConfig
from ..data.sources import IMG_FORMATS
from ..data.walk import FolderWalkWarning, glob_files
from ..eval.inference import (
    TRUST_HELP,
    WEIGHTS_HELP,
    ModelsOrWeights,
    load_inference_model,
    precision_line,
    weights_argument,
    weights_files,
)
from ..eval.slicing import SliceConfig
from ..family import nms_iou
from ..interop.loading.resolve import WEIGHTS_FLAGS
from ..names import class_names
from ..nms import NMSConfig, check_nms_limits
from ..outputs import refuse_overwriting_inputs, unique_stems
from ..progress import progress_bar
from ..runs import next_run_dir, run_lock
from ..settings import (
    add_arguments,
    add_refused,
    check_refused,
    flat_names,
    flat_values,
    from_flat,
    setting,
)
from ..task import task_of
from .classify import ClassifyResult
from .read_ahead import ReadAhead, forward_thread_shares, in_order
from .result_boxes import Boxes
from .result_outputs import DetectionOutputs
from .streams import LatestFrameReader, frame_rate, is_stream, strided_frames
from .visualize import FeatureMaps

VIDEO_FORMATS = frozenset({"asf", "avi", "gif", "m4v", "mkv", "mov", "mp4", "mpeg", "mpg", "ts", "wmv", "webm"})
_GLOB_CHARS = frozenset("*?[")
# Results stay in the file's pixels either way; reduced pixels are never handed out or written.
PREDICT_REDUCED_DECODE_NOTE = ("; predict: still JPEG files only, and only where no pixels are kept or written: a "
                               "predict(...) list, or --nosave without --save-crop, --view-img and --slice (annotated "
                               "images and crops are drawn on, and predict(stream=True) and YOLO().predict results "
                               "keep, the whole file's decode); results are in the file's pixels either way")

Source = str | os.PathLike | np.ndarray | int


@dataclass(frozen=True)
class PredictConfig:
    """``yolotrain predict``: its command line is generated from these settings and :func:`predict`'s
    keyword defaults are theirs. The reference's ``detect.py`` spellings are flags of the same settings
    (``--imgsz``, ``--conf-thres``, ``--line-thickness``, ``--nosave``)."""

    weights: tuple[str, ...] = setting((), WEIGHTS_HELP, flags=WEIGHTS_FLAGS)
    source: tuple[str, ...] = setting((), "image, video, folder, glob, camera index (0, 1 ...) or rtsp://, "
                                      "rtmp://, http(s):// stream (several allowed)")
    img_size: int | None = setting(None, "inference size (px; default 640, 1280 for P6 models; the reference's "
                                   "--imgsz H W only when square)", flags=("--img", "--img-size", "--imgsz"))
    nms: NMSConfig = field(default_factory=NMSConfig)
    augment: bool = setting(False, "test-time augmentation, the reference's: each image also at 0.83x flipped "
                            "and 0.67x, detections merged by one NMS (PyTorch detection models)")
    slicing: SliceConfig = field(default_factory=SliceConfig)
    device: str | None = setting(None, "cpu, cuda, 0 ... (default: GPU if available)")
    half: bool | None = setting(None, "half-precision inference: float16 on CUDA, bfloat16 on the CPU "
                                  "(default: where the device computes it natively, else float32)")
    save: bool = setting(True, "save annotated images and videos (--nosave: only what the other --save "
                         "options ask for and predictions.json)", off_flags=("--nosave",))
    save_txt: bool = setting(False, "also write YOLO-format labels/*.txt (each row ends with its score; "
                             "segmentation models: polygon rows)")
    save_crop: bool = setting(False, "save each detection as crops/CLASS/STEM.jpg")
    hide_labels: bool = setting(False, "draw boxes without class labels")
    hide_conf: bool = setting(False, "draw labels without scores")
    line_width: int | None = setting(None, "box line width in pixels (default: scaled to the image)",
                                     flags=("--line-width", "--line-thickness"))
    vid_stride: int = setting(1, "predict every N-th video/stream frame")
    reduced_decode: bool = setting(DataConfig.reduced_decode, REDUCED_DECODE_HELP + PREDICT_REDUCED_DECODE_NOTE)
    retina_masks: bool = setting(False, "segmentation models: masks made at the original image's resolution "
                                 "(sharper edges; default: at the network input's, then resized)")
    view_img: bool = setting(False, "show each annotated image or frame in a window (needs a display and an "
                             "OpenCV with window support)", flags=("--view-img", "--show"))
    trust_code: bool = setting(False, TRUST_HELP, flags=("--trust-model-code",))
    visualize: bool = setting(False, "save each image's feature maps, layer by layer, in a folder STEM (the "
                              "reference's stageN_Module_features.png/.npy; PyTorch models)")
    project: str = setting("runs/predict", "parent of the run folder")
    name: str = setting("exp", "run folder name (exp, exp2 ... when taken)")
    exist_ok: bool = setting(False, "reuse an existing run folder")


class SourceWarning(UserWarning):
    """Some prediction sources could not be read and were skipped."""


@dataclass
class Result(DetectionOutputs):
    """Detections of one image or video frame, in original image pixels.

    ``boxes`` ``[n, 4]`` x1, y1, x2, y2 (float), ``scores`` ``[n]``, ``classes`` ``[n]`` (long), sorted
    by score; ``names`` maps class ids to names; ``frame`` is the frame index for videos and streams.
    ``boxes`` is a :class:`~yolotrain.prediction.result_boxes.Boxes` tensor, which also answers ``boxes.xyxy``,
    ``.xywh``, ``.conf``, ``.cls`` and ``.data`` (``[n, 6]``) as YOLO tooling's results do.
    A segmentation model's results also carry each detection's ``masks`` (bool ``[n, h, w]`` of the
    original image) and ``polygons`` (its outline, ``(k, 2)`` float32 x, y pixels, k >= 3; its box's
    four corners when the mask is too small for an outline: empty, one pixel or one line); both are None
    for a detector. An oriented-box model's results carry ``rotated`` ``[n, 5]`` (cx, cy, w, h in original
    pixels, angle in radians), their four corners as ``polygons`` and their axis-aligned bounds as ``boxes``. A pose
    model's results carry each detection's ``keypoints`` (float32 ``[n, K, D]``: x, y original pixels, and with
    D == 3 the predicted visibility, 0..1); None for other models.
    ``image`` is the BGR image or frame predicted on, on the results of ``predict(stream=True)`` only
    (a list of results would hold every frame of a video).
    ``plot()``, ``save(path)``, ``to_json()`` and ``to_df()`` come from :class:`DetectionOutputs`.
    """

    path: str
    boxes: torch.Tensor
    scores: torch.Tensor
    classes: torch.Tensor
    names: list[str]
    orig_shape: tuple[int, int]
    frame: int | None = None
    masks: np.ndarray | None = None
    polygons: list[np.ndarray] | None = None
    image: np.ndarray | None = field(default=None, repr=False, compare=False)
    rotated: torch.Tensor | None = None
    keypoints: np.ndarray | None = None

    def summary(self) -> str:
        """What was found, as the reference's detect.py says it: ``PATH: 2 circles, 1 square`` (``PATH frame N:
        ...`` in a video)."""
        where = self.path if self.frame is None else f"{self.path} frame {self.frame}"
        counts = torch.bincount(self.classes, minlength=len(self.names)).tolist()
        found = ", ".join(f"{n} {self.names[c]}{'s' if n > 1 else ''}" for c, n in enumerate(counts) if n)
        return f"{where}: {found or 'no detections'}"

    @classmethod
    def run_summary(cls, results: list[Result]) -> str:
        """How many images or frames, and how many detections in all."""
        return f"{len(results)} images/frames, {sum(len(r.scores) for r in results)} detections."

    def __post_init__(self) -> None:
        self.boxes = Boxes.of(self.boxes, self.scores, self.classes)

    def to_dict(self) -> dict:
        """JSON-ready form: one entry per detection with its box, score, class id and name (and, for a
        segmentation model, its polygon in pixels)."""
        dets = [{"box": [round(v, 2) for v in box], "score": round(s, 5), "class": c, "name": self.names[c]}
                for box, s, c in zip(self.boxes.tolist(), self.scores.tolist(), self.classes.tolist())]
        for det, polygon in zip(dets, self.polygons or ()):
            det["polygon"] = [round(v, 1) for v in polygon.reshape(-1).tolist()]
        for det, rotated in zip(dets, [] if self.rotated is None else self.rotated.tolist()):
            det["rbox"] = [round(v, 2) for v in rotated[:4]] + [round(rotated[4], 5)]
        for det, points in zip(dets, () if self.keypoints is None else self.keypoints):
            det["keypoints"] = [round(v, 3) for v in points.reshape(-1).tolist()]
        out = {"source": self.path, "height": self.orig_shape[0], "width": self.orig_shape[1], "detections": dets}
        if self.frame is not None:
            out["frame"] = self.frame
        return out

    def yolo_lines(self) -> list[str]:
        """Rows ``class cx cy w h score`` normalised to the image, as YOLO label files hold them; for a
        segmentation model ``class x1 y1 x2 y2 ... score`` (its outline, or its box's corners for a mask too
        small for one), for a pose model ``class cx cy w h x0 y0 [v0] ... score``: a row for every detection."""
        h, w = self.orig_shape
        if self.polygons is not None:
            scale = np.array((w, h), np.float64)
            return [" ".join([str(c), *(f"{v:.6f}" for v in (polygon / scale).reshape(-1)), f"{s:.5f}"])
                    for c, polygon, s in zip(self.classes.tolist(), self.polygons, self.scores.tolist())]
        b = self.boxes.double()
        xywh = torch.stack(((b[:, 0] + b[:, 2]) / 2 / w, (b[:, 1] + b[:, 3]) / 2 / h,
                            (b[:, 2] - b[:, 0]) / w, (b[:, 3] - b[:, 1]) / h), 1)
        points = [""] * len(xywh)
        if self.keypoints is not None:  # ultralytics' pose rows: the keypoints (normalised x, y[, v]) after the box
            normalised = self.keypoints.astype(np.float64) / np.array([w, h, 1.0][:self.keypoints.shape[-1]])
            points = ["".join(f" {v:.6f}" for v in row.reshape(-1)) for row in normalised]
        return [f"{c} {x:.6f} {y:.6f} {bw:.6f} {bh:.6f}{p} {s:.5f}"
                for c, (x, y, bw, bh), p, s in zip(self.classes.tolist(), xywh.tolist(), points, self.scores.tolist())]


def _suffix(path: Path) -> str:
    return path.suffix[1:].lower()


def expand_sources(source: Source | Sequence[Source]) -> list[Path | np.ndarray | str]:
    """Flatten ``source`` into image/video files (and in-memory BGR arrays), in a stable order.

    A folder contributes its image and video files (not recursive), a glob its matches, a list each
    of its items. Camera indices (``0``, ``"1"``) and stream URLs (``rtsp://``, ``rtmp://``,
    ``http(s)://``) stay as strings, to be opened by :class:`~yolotrain.prediction.streams.LatestFrameReader`.

    Raises:
        FileNotFoundError: a named path does not exist, or a glob or folder holds nothing to read.
    """
    items = list(source) if isinstance(source, (list, tuple)) else [source]
    out: list[Path | np.ndarray | str] = []
    for item in items:
        if isinstance(item, np.ndarray):
            out.append(item)
            continue
        if is_stream(item):
            out.append(str(item))
            continue
        text = os.fspath(item)
        if _GLOB_CHARS & set(text) and not Path(text).exists():
            matches, walk = glob_files(text)  # a ** walk follows each real folder once: link loops end
            if walk is not None and walk.repeats(text):
                warnings.warn(walk.repeats(text), FolderWalkWarning, stacklevel=2)
            if not matches:
                raise FileNotFoundError(f"no files match {text}")
            out += matches
        elif Path(text).is_dir():
            files = sorted(p for p in Path(text).iterdir()
                           if p.is_file() and _suffix(p) in IMG_FORMATS | VIDEO_FORMATS)
            if not files:
                raise FileNotFoundError(f"no images or videos in {text}")
            out += files
        elif Path(text).is_file():
            out.append(Path(text))
        else:
            raise FileNotFoundError(f"source not found: {text}")
    return out


def prepare_image(image: np.ndarray, img_size: int, stride: int = 32, square: bool = False,
                  orig_shape: tuple[int, int] | None = None) -> tuple[np.ndarray, tuple, tuple]:
    """Letterbox a BGR image to the smallest stride-multiple rectangle around its ``img_size`` fit
    (to the ``img_size`` square with ``square=True``, for exports fixed at that size).

    ``orig_shape`` (h, w): the size of the image ``image`` was decoded from at a reduced scale; the input is
    then laid out, and the gain given, as for that image at full size.

    Returns the RGB input image and the (x, y) gain and (left, top) pad mapping original pixels to it.
    """
    h0, w0 = orig_shape or image.shape[:2]
    _, resized, _ = letterbox_geometry(np.array([w0, h0]), np.array([img_size, img_size]))
    uw, uh = (int(v) for v in resized)
    if image.shape[:2] != (h0, w0):  # a reduced decode: to the full image's resized size, so only padding remains
        image = cv2.resize(image, (uw, uh), interpolation=cv2.INTER_LINEAR)
    # Minimal padding: only up to the next stride multiple (the reference's "auto" letterbox).
    shape = (img_size, img_size) if square else (uh + (img_size - uh) % stride, uw + (img_size - uw) % stride)
    boxed, _, pad = letterbox(image, shape, scaleup=True)
    return cv2.cvtColor(boxed, cv2.COLOR_BGR2RGB), (uw / w0, uh / h0), pad


class Predictor:
    """A loaded model with fixed settings; call :meth:`predict_image` per image for the boxes of a
    :class:`~yolotrain.detector.BoxDetector` (another task's predictor takes over the loaded model:
    :meth:`yolotrain.task.Task.predictor`)."""

    def __init__(self, model_or_weights: ModelsOrWeights, img_size: int | None = None, conf: float = NMSConfig.conf,
                 iou: float | None = NMSConfig.iou, classes: Sequence[int] | None = None,
                 max_det: int = NMSConfig.max_det, agnostic: bool = NMSConfig.agnostic,
                 device: str | torch.device | None = None, half: bool | None = None,
                 trust_code: bool = False, retina_masks: bool = PredictConfig.retina_masks,
                 augment: bool = PredictConfig.augment, slice: int | None = SliceConfig.slice,
                 slice_overlap: float = SliceConfig.slice_overlap, reuse_copy: bool = False) -> None:
        # reuse_copy: a model given in memory runs as the inference copy made for it the last time, while its
        # weights are unchanged (see yolotrain.eval.inference.load_one_model).
        self.model, self.device = load_inference_model(model_or_weights, device, fuse=True, half=half,
                                                       trust_code=trust_code, augment=augment, slice=slice,
                                                       slice_overlap=slice_overlap, reuse_copy=reuse_copy)
        self.task = task_of(self.model)
        self.task.check_inference(self.model)
        self.retina_masks = retina_masks
        self.stride = max(self.model.size_multiple, 32)
        self.square = not self.model.dynamic_size
        if img_size is None:  # the size the model was made for: an export's fixed size, 1280 for P6, else 640
            img_size = self.model.default_img_size
        check_image_size(img_size, self.stride)
        if self.square and self.model.fixed_size != (img_size, img_size):
            raise ValueError(f"this export takes {'x'.join(map(str, self.model.fixed_size))} images only, "
                             f"not {img_size}: pass that image size")
        self.names = class_names(self.model.names, self.model.num_classes)
        check_nms_limits(max_det, classes, self.model.num_classes)
        self.dtype = self.model.dtype
        self.img_size, self.conf, self.iou = img_size, conf, nms_iou(iou, self.model, "predict")
        self.classes, self.max_det, self.agnostic = classes, max_det, agnostic

    def decode_scale(self, orig_shape: tuple[int, int]) -> float:
        """How large an image of ``orig_shape`` (h, w) is used relative to its size: its letterboxed fit."""
        return self.img_size / max(orig_shape)

    def predict_image(self, image: np.ndarray, path: str = "", frame: int | None = None,
                      orig_shape: tuple[int, int] | None = None) -> Result:
        """Detections of one BGR ``uint8`` image, in its pixels; with ``orig_shape`` (h, w), ``image`` is a reduced
        decode of an image of that size, the detections are in that image's pixels and the result keeps no image."""
        rgb, gain, pad = prepare_image(image, self.img_size, self.stride, self.square, orig_shape)
        x = torch.from_numpy(rgb).to(self.device).permute(2, 0, 1)[None].to(self.dtype) / 255
        with torch.inference_mode():
            if self.model.end_to_end:  # an export with NMS inside (detection only: the other tasks refuse one)
                det = self.model.detections(x, self.conf, self.iou, self.max_det, classes=self.classes,
                                            agnostic=self.agnostic)[0]
                proto = None
            else:
                pred, proto = self.task.infer(self.model, x)
                det = self.task.suppress(pred.float(), self.conf, self.iou, self.classes, self.agnostic,
                                         max_det=self.max_det, num_extra=self.task.nms_extra_columns(self.model))[0]
        h0, w0 = orig_shape or image.shape[:2]
        # The xyxy boxes in the original image and, for rotated boxes, their xywhr there (else None).
        boxes, rotated = self.task.result_boxes(self.task.original_boxes(det, gain, pad, (h0, w0)))
        # What the task's model gives beside the boxes, in the original image (a segmentation model's masks and
        # outlines, a pose model's keypoints, an oriented-box model's corners); nothing for a detector's boxes.
        fields = self.task.result_fields(None if proto is None else proto[0], det, boxes, x.shape[2:], gain, pad,
                                         (h0, w0), self.retina_masks)
        return Result(path, boxes.cpu(), det[:, 4].cpu(), det[:, 5].long().cpu(), self.names, (h0, w0), frame,
                      image=None if orig_shape else image, rotated=None if rotated is None else rotated.cpu(),
                      **fields)


def _frames(path: Path, vid_stride: int = 1) -> Iterator[tuple[int, np.ndarray, float]]:
    """Every ``vid_stride``-th frame of a video with its index and the frame rate of the frames kept;
    nothing when the video cannot be opened."""
    cap = cv2.VideoCapture(str(path))
    try:
        fps = frame_rate(cap, vid_stride)
        for index, frame in strided_frames(cap, vid_stride):
            yield index, frame, fps
    finally:
        cap.release()


def _output_stem(item: Path | np.ndarray | str, position: int) -> str:
    """The stem a source item's outputs would carry before :func:`unique_stems`."""
    if isinstance(item, np.ndarray):
        return f"image{position}"
    return _live_name(item, position) if isinstance(item, str) else item.stem


def _live_name(source: str, position: int) -> str:
    """File stem for the outputs of a camera (``camera0``) or stream (``stream3``, by source position)."""
    return f"camera{source}" if source.isdigit() else f"stream{position}"


def check_display() -> None:
    """``ValueError`` in one line saying why no window can be shown here: an OpenCV built without window
    support (``opencv-python-headless``), or no display to show one on."""
    gui = re.search(r"^\s*GUI:\s*(\S+)", cv2.getBuildInformation(), re.MULTILINE)
    if gui is None or gui.group(1).upper() == "NONE":
        raise ValueError("--view-img cannot show a window: this OpenCV has no window support "
                         "(opencv-python-headless); install opencv-python for it, or leave --view-img out")
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise ValueError("--view-img cannot show a window: there is no display ($DISPLAY and $WAYLAND_DISPLAY "
                         "are not set)")


def _show(window: str, image: np.ndarray) -> None:
    """``image`` in a resizable window named after its source, given 1 ms to draw, as the reference shows it."""
    cv2.namedWindow(window, cv2.WINDOW_NORMAL | cv2.WINDOW_KEEPRATIO)
    cv2.imshow(window, image)
    cv2.waitKey(1)


class _Outputs:
    """Writes what a run saves: annotated images/videos, YOLO ``.txt`` rows, crops and the run's JSON."""

    def __init__(self, save_dir: Path | None, save_txt: bool, save_crop: bool, draw_options: dict,
                 save_media: bool = True, view: bool = False, features: FeatureMaps | None = None) -> None:
        self.save_dir = save_dir
        self.features = features
        self.save_media = save_media and save_dir is not None
        self.view = view
        self.save_txt = save_txt and save_dir is not None
        self.save_crop = save_crop and save_dir is not None
        self.draw_options = draw_options
        self.stems: list[str] = []  # the stem each result's files carry, in result order
        if save_dir is not None:
            save_dir.mkdir(parents=True, exist_ok=True)
            if self.save_txt:
                (save_dir / "labels").mkdir(exist_ok=True)

    def draw(self, image: np.ndarray, result: Result | ClassifyResult) -> np.ndarray:
        return result.annotate(image, **self.draw_options)

    def image(self, name: str, image: np.ndarray, result: Result) -> None:
        self.stems.append(Path(name).stem)
        if self.save_media or self.view:
            annotated = self.draw(image, result)
            if self.view:
                _show(result.path, annotated)
            if self.save_media:
                cv2.imwrite(str(self.save_dir / name), annotated)
        if self.save_dir is None:
            return
        self.txt(Path(name).stem, result)
        self.crops(Path(name).stem, image, result)
        self.feature_maps(Path(name).stem)

    def frame(self, stem: str, image: np.ndarray, result: Result, writer: cv2.VideoWriter | None) -> None:
        """One video or stream frame: onto the annotated video, and its labels and crops as ``STEM_FRAME``."""
        self.stems.append(stem)
        if writer is not None or self.view:
            annotated = self.draw(image, result)
            if self.view:
                _show(result.path, annotated)
            if writer is not None:
                writer.write(annotated)
        self.txt(f"{stem}_{result.frame}", result)
        self.crops(f"{stem}_{result.frame}", image, result)
        self.feature_maps(f"{stem}_{result.frame}")

    def feature_maps(self, stem: str) -> None:
        """With ``visualize``: the feature maps of the image just predicted, into the folder ``STEM``."""
        if self.features is not None:
            self.features.save(self.save_dir / stem)

    def crops(self, stem: str, image: np.ndarray, result: Result) -> None:
        """Each detection's box cut from the original image into ``crops/CLASS/STEM.jpg`` (``STEM2.jpg``,
        ``STEM3.jpg`` ... when an image has several of a class, as the reference numbers them)."""
        if not self.save_crop:
            return
        h, w = image.shape[:2]
        for (x1, y1, x2, y2), c in zip(result.boxes.tolist(), result.classes.tolist()):
            left, top = max(math.floor(x1), 0), max(math.floor(y1), 0)
            right, bottom = min(math.ceil(x2), w), min(math.ceil(y2), h)
            if right <= left or bottom <= top:
                continue
            folder = self.save_dir / "crops" / result.names[c].replace(os.sep, "_")
            folder.mkdir(parents=True, exist_ok=True)
            path, n = folder / f"{stem}.jpg", 2
            while path.exists():
                path, n = folder / f"{stem}{n}.jpg", n + 1
            cv2.imwrite(str(path), image[top:bottom, left:right])

    def txt(self, stem: str, result: Result) -> None:
        if self.save_txt:
            lines = result.yolo_lines()
            (self.save_dir / "labels" / f"{stem}.txt").write_text("".join(f"{line}\n" for line in lines))

    def video_writer(self, stem: str, frame: np.ndarray, fps: float) -> cv2.VideoWriter | None:
        if not self.save_media:
            return None
        h, w = frame.shape[:2]
        return cv2.VideoWriter(str(self.save_dir / f"{stem}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))

    def json(self, results: list[Result]) -> None:
        """``predictions.json``: each result's entry (its ``source`` path) with ``saved_as``, the stem of the files
        written for it (``STEM.jpg`` or ``STEM.mp4``, ``labels/STEM.txt`` or ``STEM_FRAME.txt``, crops)."""
        if self.save_dir is not None:
            entries = [r.to_dict() | {"saved_as": stem} for r, stem in zip(results, self.stems)]
            (self.save_dir / "predictions.json").write_text(json.dumps(entries))


def predict(
    model_or_weights: ModelsOrWeights,
    source: Source | Sequence[Source],
    img_size: int | None = PredictConfig.img_size,
    conf: float = NMSConfig.conf,
    iou: float | None = NMSConfig.iou,
    classes: Sequence[int] | None = NMSConfig.classes,
    max_det: int = NMSConfig.max_det,
    agnostic: bool = NMSConfig.agnostic,
    device: str | torch.device | None = PredictConfig.device,
    half: bool | None = PredictConfig.half,
    save_dir: str | os.PathLike | None = None,
    save_txt: bool = PredictConfig.save_txt,
    save_crop: bool = PredictConfig.save_crop,
    hide_labels: bool = PredictConfig.hide_labels,
    hide_conf: bool = PredictConfig.hide_conf,
    line_width: int | None = PredictConfig.line_width,
    vid_stride: int = PredictConfig.vid_stride,
    reduced_decode: bool = PredictConfig.reduced_decode,
    trust_code: bool = PredictConfig.trust_code,
    retina_masks: bool = PredictConfig.retina_masks,
    save: bool = PredictConfig.save,
    view_img: bool = PredictConfig.view_img,
    visualize: bool = PredictConfig.visualize,
    stream: bool = False,
    callbacks: Callbacks | CallbackSpec | None = None,
    augment: bool = PredictConfig.augment,
    slice: int | None = SliceConfig.slice,
    slice_overlap: float = SliceConfig.slice_overlap,
) -> list[Result | ClassifyResult] | Iterator[Result | ClassifyResult]:
    """Detect objects in images, videos, cameras and network streams (a classifier: the top-5 classes of each
    image with their probabilities, as :class:`~yolotrain.prediction.classify.ClassifyResult`).

    Args:
        model_or_weights: a :class:`~yolotrain.Yolov5` (used through a fused copy) or a weights path; a list
            of several checkpoints or ``.pt`` files of detection models of the same classes: the reference's
            ensemble, their predictions merged before one NMS.
        source: an image or video file, a folder, a glob, a BGR ``uint8`` array, a camera index
            (``0``, ``"1"``), an ``rtsp://``, ``rtmp://`` or ``http(s)://`` stream, or a list of these.
            Live sources are read on a background thread that keeps only the newest frame; Ctrl-C
            ends them cleanly (what was predicted so far is saved and returned).
        img_size: long side of the network input (default: the model's training size, 640; 1280 for P6
            models); inputs are padded only to the next multiple of the largest stride (32; 64 for P6).
        conf, iou, classes, max_det, agnostic: NMS settings (``iou`` by default the model family's: 0.45 for
            YOLOv5, 0.7 for anchor-free models).
        half: half-precision inference: float16 on CUDA, bfloat16 on the CPU; None (the default): where
            the device computes it natively (CUDA; CPUs with AMX or AVX512-BF16), else float32.
        save_dir: where annotated images (same names), videos (``STEM.mp4``; ``cameraN.mp4`` for
            camera N, ``streamN.mp4`` for the stream at position N of ``source``), ``labels/*.txt``
            (with ``save_txt``; video frames as ``STEM_FRAME.txt``), crops and ``predictions.json`` go.
            Sources of equal names get distinct outputs: the second ``x.jpg`` is saved as ``x_2.jpg``
            (``labels/x_2.txt`` ...), in source order; ``predictions.json`` gives each result's ``source``
            and the stem its files were ``saved_as``.
        save_crop: save each detection's box, cut from the original image, as
            ``crops/CLASS/STEM.jpg`` (``STEM2.jpg`` ... when several).
        hide_labels, hide_conf, line_width: drawing of the annotated outputs: boxes without labels,
            labels without scores, box lines ``line_width`` pixels wide (default: scaled to the image).
        vid_stride: predict every N-th frame of videos and live sources.
        reduced_decode: decode a still JPEG at least twice the size it is predicted at by 1/2, 1/4 or 1/8 (the most
            that keeps it at or above that size), then letterbox it as its full decode would be: the results are
            in the file's pixels (boxes, masks, keypoints, ``orig_shape``) and close to a full decode's. Only
            where no pixels leave the run: with ``save`` (and a ``save_dir``), ``save_crop``, ``view_img``,
            ``slice`` or ``stream`` (whose results keep their image) every file is decoded at full size.
        retina_masks: for a segmentation model, make the masks at the original image's resolution
            (sharper edges) instead of at the network input's, then resized. Its results carry ``masks``
            and ``polygons``; its pictures show the masks, its ``labels/*.txt`` hold polygon rows.
        trust_code: load weights that are programs (TorchScript, TensorRT engines), which run their own
            code when loaded; without it they are refused before anything of them is loaded.
        save: with ``save_dir``, save the annotated images and videos (the other files as asked).
        view_img: show each annotated image or frame in a window as it is predicted; where no window
            can be shown (no display, or an OpenCV without window support) that is an error before
            anything is loaded.
        visualize: save the feature maps of each image (and video frame) as the reference's
            ``--visualize`` does, in the folder ``STEM`` (``STEM_FRAME``) of ``save_dir``: for each layer but
            the head, ``stage{i}_{Module}_features.png`` (its first 32 channels) and ``.npy`` (all of them,
            float32); PyTorch models only (an export has no layers to look into: ValueError).
        stream: return an iterator that predicts one image or frame per step, instead of the list of
            all (a long video or a live source then holds one frame's result in memory at a time).
            The model, sources and output folder are checked before it is returned; ``predictions.json``
            is written when it is exhausted or closed.
        callbacks: functions for ``on_predict_start`` (the :class:`Predictor`), ``on_predict_image_end``
            (each :class:`Result`) and ``on_predict_end`` (all of them), as ``{hook: fn or [fn, ...]}``.
        augment: the reference's test-time augmentation (:mod:`.tta`; PyTorch detection models only).
        slice, slice_overlap: sliced inference (:mod:`yolotrain.eval.slicing`; PyTorch detection and
            segmentation models): the letterboxed input (give ``img_size`` at the images' resolution) cut into
            tiles of ``slice`` px overlapping by at least ``slice_overlap`` of a tile, their detections merged
            by the NMS (a segmentation model's masks made from the tiles' prototypes stitched into the image's).

    Returns:
        One :class:`Result` per image and per predicted video frame, in source order (with ``stream``,
        an iterator of them). Files that cannot be read are skipped and named in one :class:`SourceWarning`.

    Raises:
        ValueError: a camera or stream cannot be opened (before anything is predicted or written).
    """
    if vid_stride < 1:
        raise ValueError(f"vid_stride must be at least 1, got {vid_stride}")
    if line_width is not None and line_width < 1:
        raise ValueError(f"line_width must be at least 1 pixel, got {line_width}")
    if view_img:
        check_display()
    if visualize and save_dir is None:
        raise ValueError("visualize writes the feature maps into save_dir: give one")
    hooks = as_callbacks(callbacks)
    predictor = Predictor(model_or_weights, img_size, conf, iou, classes, max_det, agnostic, device, half, trust_code,
                          retina_masks, augment, slice, slice_overlap,
                          reuse_copy=not visualize)  # --visualize hooks stay on its model: a copy of its own
    # The task says what predicts on each image: these detection settings, or a classifier's top five.
    predictor = predictor.task.predictor(predictor, img_size, save_crop)
    features = FeatureMaps(predictor.model) if visualize else None
    items = expand_sources(source)
    if save_dir is not None:
        refuse_overwriting_inputs([("--project/--name", save_dir)], weights_files(model_or_weights)
                                  + [("source", item) for item in items if isinstance(item, Path)])
    # Live sources are opened first, so one that cannot be opened stops the run before anything is written.
    live: dict[int, LatestFrameReader] = {}
    # The run folder's lock, from here until the results are all written (one writer per run folder).
    held = contextlib.ExitStack()
    try:
        for n, item in enumerate(items):
            if isinstance(item, str):
                live[n] = LatestFrameReader(item, vid_stride)
        held.enter_context(run_lock(save_dir))
        draw_options = {"line_width": line_width, "hide_labels": hide_labels, "hide_conf": hide_conf}
        outputs = _Outputs(Path(save_dir) if save_dir is not None else None, save_txt, save_crop, draw_options,
                           save, view_img, features)
    except BaseException:
        _close_readers(live)
        held.close()
        raise
    # The pixels of a reduced decode are never kept or written: whatever shows or saves an image decodes it whole.
    reduced = reduced_decode and not (outputs.save_media or outputs.save_crop or view_img or slice or stream)
    results = _predict_all(predictor, outputs, items, live, vid_stride, hooks, held, reduced)
    # A stream dropped before its first step never runs its cleanup: the lock is released when it is collected.
    weakref.finalize(results, held.close)
    return results if stream else [replace(result, image=None) for result in results]


def _close_readers(live: dict[int, LatestFrameReader]) -> None:
    for reader in live.values():
        reader.close()


def _predict_all(predictor: Predictor, outputs: _Outputs, items: list[Path | np.ndarray | str],
                 live: dict[int, LatestFrameReader], vid_stride: int, hooks: Callbacks,
                 held: contextlib.ExitStack, reduced: bool = False) -> Iterator[Result]:
    """Each result in turn; however the iteration ends, ``predictions.json`` is written with the results so
    far, the live readers are closed and the run folder's lock (in ``held``) is released."""
    results: list[Result] = []
    try:
        try:
            hooks.run("on_predict_start", predictor)
            unreadable = yield from _with_hook(_predict_items(predictor, outputs, items, live, vid_stride, reduced),
                                               results, hooks)
        finally:
            outputs.json(results)
    finally:
        _close_readers(live)
        held.close()
    if unreadable:
        shown = ", ".join(unreadable[:5]) + (" ..." if len(unreadable) > 5 else "")
        warnings.warn(f"skipped {len(unreadable)} unreadable source file(s): {shown}", SourceWarning, stacklevel=3)
    hooks.run("on_predict_end", results)


def _with_hook(predicted: Generator[Result, None, list[str]], results: list[Result],
               hooks: Callbacks) -> Generator[Result, None, list[str]]:
    """``predicted``'s results, each kept in ``results`` and given to ``on_predict_image_end``."""
    while True:
        try:
            result = next(predicted)
        except StopIteration as done:
            return done.value
        results.append(replace(result, image=None))
        hooks.run("on_predict_image_end", result)
        yield result


def _predict_items(predictor: Predictor, outputs: _Outputs, items: list[Path | np.ndarray | str],
                   live: dict[int, LatestFrameReader], vid_stride: int,
                   reduced: bool = False) -> Generator[Result, None, list[str]]:
    """Predict every source item into ``outputs``, yielding each result; returns the files that could not be read.
    With ``reduced``, large still JPEGs are decoded at a reduced scale (:func:`read_still`).

    Ctrl-C while a live source is read ends the run there, after the frame in hand, as the normal way to
    stop a stream.
    """
    unreadable: list[str] = []
    stems = unique_stems([_output_stem(item, n) for n, item in enumerate(items)])
    stills = [n for n, item in enumerate(items)
              if isinstance(item, np.ndarray) or (isinstance(item, Path) and _suffix(item) not in VIDEO_FORMATS)]
    side_by_side = (predictor.device.type == "cpu" and task_of(predictor.model).is_pytorch_model(predictor.model)
                    and outputs.features is None)
    threads = torch.get_num_threads()
    shares = forward_thread_shares(threads, len(stills), side_by_side)
    following = {n: stills[i + 1:i + 1 + max(len(shares), 1)] for i, n in enumerate(stills)}

    def read(n: int) -> tuple[np.ndarray | None, tuple[int, int] | None, Result | ClassifyResult | None]:
        """Still ``n``, the size of its full decode where it was decoded smaller, and with ``shares`` its result."""
        item = items[n]
        image, orig_shape = (item, None) if isinstance(item, np.ndarray) else read_still(item, predictor.decode_scale,
                                                                                          reduced)
        if not shares or image is None:
            return image, orig_shape, None
        return image, orig_shape, predictor.predict_image(image, _still_path(item, n), orig_shape=orig_shape)

    # The next still is decoded while this one's forward pass runs, or two are read and predicted side by side.
    with ReadAhead(read, shares) as ahead:
        yield from _predict_each(predictor, outputs, items, live, vid_stride, stems, ahead, following, unreadable,
                                 forward_thread_shares(threads, 2, side_by_side))  # a video has frames enough
    return unreadable


def _still_path(item: Path | np.ndarray, position: int) -> str:
    """What a still image's result names as its path: the file, or ``imageN.jpg`` for an array."""
    return f"image{position}.jpg" if isinstance(item, np.ndarray) else str(item)


def _predict_each(predictor: Predictor, outputs: _Outputs, items: list[Path | np.ndarray | str],
                  live: dict[int, LatestFrameReader], vid_stride: int, stems: list[str],
                  ahead: ReadAhead[int, tuple[np.ndarray | None, tuple[int, int] | None,
                                              Result | ClassifyResult | None]],
                  following: dict[int, list[int]], unreadable: list[str],
                  video_threads: Sequence[int]) -> Iterator[Result]:
    """The loop of :func:`_predict_items`: still images come from ``ahead``, each naming the next ones, with their
    results where ``ahead`` predicted them; a video file's frames are predicted side by side on threads with
    ``video_threads`` PyTorch threads (none: in turn, on this thread)."""
    for n, item in enumerate(items):
        if isinstance(item, str):
            reader = live[n]
            with _first_ctrl_c_ends_the_stream() as stop:
                frames = itertools.takewhile(lambda _: not stop.is_set(),
                                             ((index, frame, reader.fps) for index, frame in reader))
                try:
                    yield from _predict_frames(predictor, outputs, frames, item, stems[n])
                except KeyboardInterrupt:  # a second Ctrl-C, while the stream gave no frame
                    break
            if stop.is_set():
                break
        elif isinstance(item, Path) and _suffix(item) in VIDEO_FORMATS:
            if not (yield from _predict_frames(predictor, outputs, _frames(item, vid_stride), str(item), stems[n],
                                               video_threads)):
                unreadable.append(str(item))
        else:
            image, orig_shape, result = ahead.get(n, following[n])
            if image is None:
                unreadable.append(str(item))
                continue
            if result is None:
                result = predictor.predict_image(image, _still_path(item, n), orig_shape=orig_shape)
            outputs.image(stems[n] + (".jpg" if isinstance(item, np.ndarray) else item.suffix), image, result)
            yield result


def read_still(path: Path, decode_scale: Callable[[tuple[int, int]], float],
               reduced: bool = True) -> tuple[np.ndarray | None, tuple[int, int] | None]:
    """The BGR image file at ``path`` to predict on (None when OpenCV cannot read it), and the (h, w) of its full
    decode when it was decoded smaller: with ``reduced``, a JPEG whose header gives its size is decoded at the
    largest reduction still at or above ``decode_scale(size)`` times it (see
    :func:`~yolotrain.data.dataset.decode_flag`); anything else, or a reduced decode not of the size the
    header promises, is read whole."""
    orig_shape = decoded_size(path) if reduced and path.suffix.lower() in JPEG_SUFFIXES else None
    if orig_shape is not None:
        flag = decode_flag(path, decode_scale(orig_shape))
        factor = reduction_factor(flag)
        if factor > 1:
            image = cv2.imread(str(path), flag)
            if image is not None and image.shape[:2] == tuple(-(-side // factor) for side in orig_shape):
                return image, orig_shape
    return cv2.imread(str(path), cv2.IMREAD_COLOR), None


@contextlib.contextmanager
def _first_ctrl_c_ends_the_stream() -> Iterator[threading.Event]:
    """An event a first Ctrl-C sets, so the stream loop stops between frames: each frame is then in the
    video, the label files and the results alike, or in none. A second Ctrl-C interrupts at once (a
    stream that sends no more frames). Off the main thread, where Python cannot catch signals, the
    event is never set and Ctrl-C interrupts as usual."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    # None: a handler installed outside Python; Python's own then stands in for it.
    previous = signal.getsignal(signal.SIGINT) or signal.default_int_handler

    def request_stop(signum: int, frame: object) -> None:
        stop.set()
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, request_stop)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _predict_frames(predictor: Predictor, outputs: _Outputs, frames: Iterable[tuple[int, np.ndarray, float]],
                    path: str, stem: str, torch_threads: Sequence[int] = ()) -> Generator[Result, None, int]:
    """Predict a sequence of ``(index, frame, fps)`` into the video ``STEM.mp4`` and per-frame files,
    yielding each result; returns how many frames were predicted. With ``torch_threads`` (a video file's frames)
    frames are predicted side by side on threads with those PyTorch thread counts while the next is decoded,
    results in frame order. The video is finalised however the sequence ends (Ctrl-C or a closed stream
    included)."""
    writer, count = None, 0

    def predict(item: tuple[int, np.ndarray, float]) -> Result:
        return predictor.predict_image(item[1], path, frame=item[0])

    predicted = (in_order(predict, frames, torch_threads) if torch_threads
                 else ((item, predict(item)) for item in frames))
    try:
        for (_, frame, fps), result in predicted:
            writer = writer or outputs.video_writer(stem, frame, fps)
            outputs.frame(stem, frame, result, writer)
            count += 1
            yield result
        return count
    finally:
        predicted.close()
        if writer is not None:
            writer.release()


# Options of the reference's detect.py that yolotrain does not have, and why: each stops the command in
# one line rather than being ignored. docs/coming-from-yolov5.md lists them.
UNSUPPORTED_PREDICT_OPTIONS = {
    "--data": "class names come from the weights (a checkpoint, a .pt or an export's metadata), not a dataset YAML",
    "--update": "predict does not rewrite weights files",
    "--dnn": "ONNX models run with ONNX Runtime, not OpenCV DNN",
}
# The settings predict() takes as keywords (the others say what to predict and where the run folder goes).
_RUN_ONLY = ("weights", "source", "project", "name", "exist_ok")


def add_predict_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``yolotrain predict`` options (:class:`PredictConfig`, the reference's spellings) to ``parser``."""
    add_arguments(parser, PredictConfig, required=("weights", "source"))
    for action in parser._actions:
        if action.dest == "img_size":  # the reference's --imgsz H W (one value means square)
            action.nargs = "+"
    # The reference's --save-conf adds scores to the --save-txt rows, which always end with theirs here.
    parser.add_argument("--save-conf", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="a line per image or frame (what was found in it) above the progress bar")
    add_refused(parser, UNSUPPORTED_PREDICT_OPTIONS)
    return parser


def predict_config(args: argparse.Namespace) -> PredictConfig:
    """The validated :class:`PredictConfig` of parsed ``predict`` options; a refused reference option is one line."""
    check_refused(args, UNSUPPORTED_PREDICT_OPTIONS)
    names = flat_names(PredictConfig)
    settings = {k: v for k, v in vars(args).items() if k in names}
    if "img_size" in settings:
        sizes = settings["img_size"]
        if len(set(sizes)) > 1 or len(sizes) > 2:
            raise ValueError(f"--imgsz {' '.join(map(str, sizes))}: only square inputs are predicted on; give one "
                             "size (the long side of the letterboxed input)")
        settings["img_size"] = sizes[0]
    return from_flat(PredictConfig, settings)


def precision_announcement(half: bool | None) -> dict[str, Callable[[Predictor], None]] | None:
    """The ``on_predict_start`` hook of the ``predict`` and ``track`` commands under ``--half auto`` (None
    otherwise): their first line says which precision the model runs in."""
    def announce(predictor: Predictor) -> None:
        if line := precision_line(predictor.model, predictor.device):
            print(line)

    return {"on_predict_start": announce} if half is None else None


def expected_frames(source: Source | Sequence[Source], vid_stride: int = 1) -> int | None:
    """How many images and frames :func:`predict` gives for ``source``: each image, and a video's frames
    (one in ``vid_stride``) as its container counts them; None with a camera or stream, which has no end,
    and None for sources that cannot be read: :func:`predict` says what is wrong with them, after the
    checks of its settings, so the bar's total never decides which error a user sees first."""
    try:
        items = expand_sources(source)
    except (OSError, ValueError):
        return None
    total = 0
    for item in items:
        if isinstance(item, str):
            return None
        if isinstance(item, Path) and _suffix(item) in VIDEO_FORMATS:
            capture = cv2.VideoCapture(str(item))
            total += -(-max(int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), 0) // vid_stride)
            capture.release()
        else:
            total += 1
    return total


def progress_hooks(bar: tqdm, verbose: bool) -> dict[str, Callable[[Result | ClassifyResult], None]]:
    """The ``on_predict_image_end`` hook of the ``predict`` and ``track`` commands: ``bar`` (a progress bar)
    advances by each image or frame, and with ``verbose`` a line above it says what was found there."""
    def advance(result: Result | ClassifyResult) -> None:
        if verbose:
            bar.write(result.summary())
        bar.update()

    return {"on_predict_image_end": advance}


def run_predict(args: argparse.Namespace) -> int:
    """Run ``yolotrain predict`` from parsed arguments; returns the process exit code."""
    config = predict_config(args)
    weights = weights_argument(config.weights)
    save_dir = next_run_dir(config.project, config.name, config.exist_ok)
    keywords = {k: v for k, v in flat_values(config).items() if k not in _RUN_ONLY}
    total = expected_frames(list(config.source), config.vid_stride)
    with warnings.catch_warnings(record=True) as caught, progress_bar(total=total, desc="predict", unit="img") as bar:
        warnings.simplefilter("always", SourceWarning)
        hooks = progress_hooks(bar, getattr(args, "verbose", False)) | (precision_announcement(config.half) or {})
        results = predict(weights, list(config.source), save_dir=save_dir, callbacks=hooks, **keywords)
    for w in caught:
        print(f"warning: {w.message}")
    if not results:
        print(f"0 images/frames, 0 detections. Results saved to {save_dir}")
        return 1
    print(f"{type(results[0]).run_summary(results)} Results saved to {save_dir}")
    return 0
