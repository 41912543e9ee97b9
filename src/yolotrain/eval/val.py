"""Validation: run a detector over a labelled split and report P, R, mAP50, mAP50-95 and speed.

Two entry shapes share one loop: a model or weights path with a dataset path (the ``yolotrain val``
command), and an in-memory model with an existing val DataLoader (what training calls each epoch;
no files are written unless ``save_dir`` is given). Boxes are compared in original image pixels,
as the reference does, so clipping at image edges matches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..boxes import letterbox_geometry
from ..callbacks import Callbacks, CallbackSpec, as_callbacks
from ..checkpoint import CheckpointError, read_metadata
from ..data.batch import Batch
from ..data.dataset import loaded_size
from ..data.loaders import REDUCED_DECODE_HELP, DataConfig, build_loaders
from ..detector import BoxDetector
from ..family import ModelFamily, family_of, nms_iou
from ..interop.loading.resolve import WEIGHTS_FLAGS
from ..messages import shown_path
from ..names import class_names, describe_repeats, repeated_names
from ..nms import MAX_NMS, VAL_NMS, NMSConfig, check_nms_limits
from ..outputs import dataset_inputs, refuse_overwriting_inputs, unique_stems
from ..progress import progress_bar
from ..runs import next_run_dir, run_lock
from ..settings import (
    ConfigError,
    add_arguments,
    add_refused,
    check_refused,
    flat_names,
    flat_values,
    from_flat,
    setting,
)
from ..task import task_of
from .classify import ClassifyMetrics
from .coco import coco_evaluate, coco_ground_truth, image_ids
from .inference import (
    TRUST_HELP,
    WEIGHTS_HELP,
    ModelsOrWeights,
    load_inference_model,
    precision_line,
    weights_argument,
    weights_files,
)
from .metrics import SCORING_RULES, ConfusionMatrix, DetectionStats, Metrics, ScoringRules
from .plots import VAL_BATCH_PLOTS, plot_confusion_matrix, plot_curves
from .slicing import SliceConfig


@dataclass(frozen=True)
class EvalConfig:
    """Validation during training; the NMS defaults are the reference's mAP settings."""

    val: bool = setting(True, "validate after every epoch (the last epoch always is)", off_flags=("--noval",))
    conf: float = setting(VAL_NMS.conf, "confidence threshold for mAP", min=0, max=1)
    iou: float = setting(ModelFamily.val_iou, "NMS IoU threshold", above=0, max=1)
    max_det: int = setting(VAL_NMS.max_det, "detections kept per image", min=1, max=MAX_NMS)
    plots: bool = setting(True, "write results.png, confusion matrix, curves and prediction pictures",
                          off_flags=("--noplots",))


@dataclass(frozen=True)
class ValConfig:
    """``yolotrain val``: its command line is generated from these settings and :func:`val`'s keyword
    defaults are theirs. The reference's spellings are flags of the same settings (``--imgsz``,
    ``--conf-thres``, ``--iou-thres``)."""

    weights: tuple[str, ...] = setting((), WEIGHTS_HELP, flags=WEIGHTS_FLAGS)
    data: str | None = setting(None, "dataset folder or YAML (its val split is used; default: the one a checkpoint "
                               "of ours was trained on)")
    img_size: int | None = setting(None, "inference size (px; default 640, 1280 for P6 models)",
                                   flags=("--img", "--img-size", "--imgsz"))
    batch_size: int = setting(32, "images per batch", flags=("--batch-size", "--batch"), min=1)
    nms: NMSConfig = field(default_factory=lambda: VAL_NMS)
    rect: bool = setting(True, "rectangular batches in the reference's order (--no-rect: square letterbox)")
    augment: bool = setting(False, "test-time augmentation, the reference's: each image also at 0.83x flipped "
                            "and 0.67x, detections merged by one NMS (PyTorch detection models)")
    slicing: SliceConfig = field(default_factory=SliceConfig)
    device: str | None = setting(None, "cpu, cuda, 0 ... (default: GPU if available)")
    workers: int | None = setting(None, "loader processes", min=0)
    reduced_decode: bool = setting(DataConfig.reduced_decode, REDUCED_DECODE_HELP)
    half: bool | None = setting(None, "half-precision inference: float16 on CUDA, bfloat16 on the CPU "
                                  "(default: where the device computes it natively, else float32)")
    save_json: bool = setting(False, "COCO json + pycocotools evaluation (segmentation models: masks as RLE, segm too; "
                              "oriented boxes: rbox and poly per detection, not scored)")
    plots: bool = setting(True, "confusion matrix, P/R/F1/PR curves, val_batch*_labels/pred.jpg (--no-plots: skip "
                          "them)")
    map_classes: bool = setting(False, "score a model with other classes on the data's classes, matched by name")
    # What val does, not which task the model has: --task is the reference's spelling of it (its val.py
    # --task speed); the model's task comes with its weights.
    mode: Literal["val", "speed"] = setting("val", "speed: time pre-process, inference and NMS per image; "
                                            "nothing is written", flags=("--mode", "--task"))
    save_txt: bool = setting(False, "write labels/STEM.txt (class cx cy w h; segmentation: class x1 y1 x2 y2 ...; "
                             "oriented boxes: class x1 y1 ... x4 y4) per image")
    save_conf: bool = setting(False, "with --save-txt, add each detection's confidence")
    single_cls: bool = setting(False, "treat every class as one (data and predictions)")
    trust_code: bool = setting(False, TRUST_HELP, flags=("--trust-model-code",))
    project: str = setting("runs/val", "parent of the run folder")
    name: str = setting("exp", "run folder name (exp, exp2 ... when taken)")
    exist_ok: bool = setting(False, "reuse an existing run folder")

    def __post_init__(self) -> None:
        if self.nms.classes is not None or self.nms.agnostic:
            raise ConfigError("val scores every class: nms.classes and nms.agnostic are prediction settings")


def build_val_loader(data: str | os.PathLike, nc: int | None, img_size: int = 640, batch_size: int = 32,
                     rect: bool = True, workers: int | None = None, stride: int = 32,
                     kind: str = "boxes", reduced_decode: bool = DataConfig.reduced_decode) -> DataLoader:
    """The val split of a dataset folder or YAML as a non-augmented, ordered DataLoader (see
    :func:`yolotrain.data.loaders.build_loaders`): rectangular batches in the reference's order with
    ``rect``, shaped in multiples of ``stride`` (the model's largest: 64 for P6 models), else every
    image letterboxed to ``img_size`` square; ``kind``, what the labels are read as (see ``build_loaders``:
    ``masks``, batches of a segmentation dataset with its polygons' overlap masks at 1/4 of the input, as training
    validates); ``reduced_decode``, large JPEGs decoded at a reduced scale (see :class:`DataConfig`)."""
    config = DataConfig(path=os.fspath(data), img_size=img_size, batch_size=batch_size, workers=workers,
                        reduced_decode=reduced_decode)
    return build_loaders(config, num_classes=nc, splits=("val",), val_rect=rect, stride=stride, kind=kind).val


def scoring_rules(model: BoxDetector) -> ScoringRules:
    """The rules val scores ``model``'s detections by: its family's (:attr:`~yolotrain.family.ModelFamily.scoring`);
    a composite's (test-time augmentation, ensemble, slicing) its first member's; a runtime's the family its
    ``family`` attribute names (YOLOv5's without one)."""
    return SCORING_RULES[family_of(model).scoring]


def _check_ordered(loader: DataLoader) -> None:
    # Image geometry is looked up by position, so batches must walk the dataset in order.
    sampler = loader.batch_sampler
    if getattr(sampler, "shuffle", False) or not hasattr(loader.dataset, "shapes"):
        raise ValueError("val needs an unshuffled DataLoader over a yolotrain DetectionDataset")


def batch_geometry(dataset, start: int, count: int, input_hw: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-image (x, y) gain and (left, top) pad mapping original pixels to the batch input.

    Mirrors the eval-time loading of :class:`~yolotrain.data.DetectionDataset`: resize so the long
    side is ``img_size`` (sides rounded up), then letterbox into ``input_hw`` without enlarging.
    """
    size = np.asarray(dataset.shapes[start:start + count], dtype=np.float64).reshape(-1, 2)
    loaded = loaded_size(size, dataset.img_size)
    _, resized, pad = letterbox_geometry(loaded, np.array(input_hw[::-1]), scaleup=False)
    return resized / size, pad


def _print_speed(speed: dict[str, float], shape: tuple[int, ...]) -> None:
    print("Speed: {:.1f}ms pre-process, {:.1f}ms inference, {:.1f}ms NMS per image at shape {}".format(
        speed["preprocess"], speed["inference"], speed["nms"], shape))


class _Timer:
    """Accumulates wall time of code blocks, waiting for queued GPU work so times are real."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.total = 0.0
        self._start = 0.0

    def __enter__(self) -> _Timer:
        if self.cuda:
            torch.cuda.synchronize()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.total += time.perf_counter() - self._start


def val(
    model_or_weights: ModelsOrWeights,
    data: str | os.PathLike | DataLoader,
    img_size: int | None = ValConfig.img_size,
    batch_size: int = ValConfig.batch_size,
    conf: float = VAL_NMS.conf,
    iou: float | None = VAL_NMS.iou,
    max_det: int = VAL_NMS.max_det,
    rect: bool = ValConfig.rect,
    device: str | torch.device | None = ValConfig.device,
    workers: int | None = ValConfig.workers,
    reduced_decode: bool = ValConfig.reduced_decode,
    criterion: Callable | None = None,
    save_dir: str | os.PathLike | None = None,
    save_json: bool = ValConfig.save_json,
    plots: bool = ValConfig.plots,
    verbose: bool = True,
    half: bool | None = ValConfig.half,
    fuse: bool = True,
    map_classes: bool = ValConfig.map_classes,
    mode: str = ValConfig.mode,
    save_txt: bool = ValConfig.save_txt,
    save_conf: bool = ValConfig.save_conf,
    single_cls: bool = ValConfig.single_cls,
    trust_code: bool = ValConfig.trust_code,
    callbacks: Callbacks | CallbackSpec | None = None,
    augment: bool = ValConfig.augment,
    slice: int | None = SliceConfig.slice,
    slice_overlap: float = SliceConfig.slice_overlap,
) -> Metrics | ClassifyMetrics:
    """Evaluate a detector on a labelled split (a classifier: top-1/top-5 accuracy, see :mod:`.classify`).

    A segmentation model is scored on its boxes and its masks: the returned box :class:`Metrics` hold the
    mask ones in ``masks`` and the table prints both. Masks are compared
    at the prototypes' resolution (1/4 of the input) with the labels' polygons drawn there as overlap
    masks, as the reference's training-time validation does; a data loader's batches may carry those
    masks (a segmentation loader's :class:`~yolotrain.data.segment.SegmentBatch`), else they are read from the
    label files.

    Args:
        model_or_weights: a :class:`~yolotrain.Yolov5` (used through a fused copy, never modified) or
            a weights path (our checkpoint, an official YOLOv5 ``.pt``, or an export: ``.onnx``, OpenVINO
            ``.xml``, ``.tflite``, ``.torchscript``, TensorRT ``.engine``; exports fixed at one size are
            evaluated on square batches); a list of several checkpoints or ``.pt`` files of detection
            models of the same classes: the reference's ensemble, their predictions merged before one NMS.
        data: dataset folder or YAML (its ``val`` split), or a val DataLoader from
            :func:`yolotrain.get_loaders` (then ``img_size``, ``batch_size``, ``rect`` and ``workers``
            come from it).
        reduced_decode: decode JPEGs at least twice ``img_size`` at 1/2, 1/4 or 1/8 scale, then resize (faster on
            large photos, pixels slightly different from decoding at full size: set it off to get the reference's).
        img_size: long side of the inputs; by default the model's training size (640; 1280 for P6).
        conf, iou, max_det: NMS settings; the defaults are the reference's mAP settings (``iou``: the model family's,
            0.6 for YOLOv5, 0.7 for anchor-free models).
        criterion: a :class:`~yolotrain.YoloLoss` for the model; when given the mean val loss
            components are in ``metrics.loss``. It must accept rectangular batches when ``rect``.
        save_dir: folder for plots and ``predictions.json``; nothing is written without it.
        save_json: write COCO-format detections and ground truth and print the 12 COCO numbers
            (needs ``pycocotools``); for a segmentation model each detection's mask as an RLE of the
            original image, the labels' polygons, and the 12 ``segm`` numbers too (``metrics.masks.coco``).
        plots: with ``save_dir``, draw the confusion matrix and P/R/F1/PR curves as PNGs, and the first three
            batches with their labels and with the predictions scoring at least 0.25 (boxes, a segmentation
            model's masks) as ``val_batch{0,1,2}_labels.jpg`` and ``val_batch{0,1,2}_pred.jpg``.
        verbose: print the results table and speeds.
        half: half-precision inference: float16 on CUDA, bfloat16 on the CPU; None (the default): where
            the device computes it natively (CUDA; CPUs with AMX or AVX512-BF16), else float32, and with
            ``verbose`` a ``Precision:`` line says which (see
            :func:`~yolotrain.eval.inference.load_inference_model`).
        fuse: fold BatchNorm into convolutions for inference (same outputs, faster).
        map_classes: score a model whose class count differs from the data's (an 80-class COCO model
            on a 2-class dataset) on the data's classes, matched by name; without it that is an error,
            since it would report a meaningless mAP.
        mode: ``"val"``, or ``"speed"`` to time pre-processing, inference and NMS per image the way
            the reference benchmarks them (square letterbox, conf 0.25, IoU 0.45, nothing written:
            ``save_dir`` and the options that write files are ignored).
        save_txt: write ``labels/STEM.txt`` under ``save_dir`` for every image: one ``class cx cy w h``
            row per detection, normalised to the original image (an empty file when there is none); for
            a segmentation model ``class x1 y1 x2 y2 ...``, its mask's outline. Images of equal names in
            different folders get ``STEM_2.txt``, ``STEM_3.txt`` ... in dataset order.
        save_conf: with ``save_txt``, append each detection's confidence to its row.
        single_cls: treat every class as one, in the labels and the predictions (the model's class
            count need not match the data's); the results are reported under one class.
        trust_code: load weights that are programs (TorchScript, TensorRT engines), which run their own
            code when loaded; without it they are refused before anything of them is loaded.
        callbacks: functions for the ``on_val_*`` hooks (``{"on_val_image_end": fn}``; see
            :data:`yolotrain.callbacks.HOOKS` for what each receives).
        augment: the reference's test-time augmentation (:mod:`.tta`; PyTorch detection models only).
        slice, slice_overlap: sliced inference (:mod:`.slicing`; PyTorch detection and segmentation models): each
            letterboxed image (give ``img_size`` at the images' resolution) cut into tiles of ``slice`` px
            overlapping by at least ``slice_overlap`` of a tile, their detections merged by the NMS (a
            segmentation model's masks made from the tiles' prototypes stitched into the image's).
    """
    hooks = as_callbacks(callbacks)
    if mode not in ("val", "speed"):
        raise ValueError(f"mode must be 'val' or 'speed', got {mode!r}")
    if mode == "speed":
        rect, conf, iou, save_dir, save_json, save_txt = False, NMSConfig.conf, NMSConfig.iou, None, False, False
    check_nms_limits(max_det)
    model, dev = load_inference_model(model_or_weights, device, fuse=fuse, half=half, trust_code=trust_code,
                                      augment=augment, slice=slice, slice_overlap=slice_overlap)
    iou = nms_iou(iou, model, "predict" if mode == "speed" else "val")
    if verbose and half is None and (line := precision_line(model, dev)):
        print(line)
    # The task says how its models are scored: detection's loop below (segmentation's extends it), a
    # classifier's accuracy (eval/classify.py).
    return task_of(model).validate(
        model, model_or_weights, data, dev, img_size=img_size, batch_size=batch_size, conf=conf, iou=iou,
        max_det=max_det, rect=rect, workers=workers, reduced_decode=reduced_decode, criterion=criterion,
        save_dir=save_dir, save_json=save_json, plots=plots, verbose=verbose, map_classes=map_classes,
        save_txt=save_txt, save_conf=save_conf, single_cls=single_cls, hooks=hooks)


class DetectionValidation(Protocol):
    """What :func:`validate_detections` asks a detection-family task (``tasks/detect/evaluate.py``; segmentation
    extends it with the masks) about its models' outputs, their scores and the files written of them."""

    dataset_kind: str  # what the val loader reads the labels as (yolotrain.data.loaders.DATASET_KINDS)
    coco_result_field: str  # the key of a COCO result that holds the first of original_masks' values

    def check_inference(self, model: BoxDetector) -> None: ...

    def infer(self, model: BoxDetector, imgs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decoded predictions of a batch and (masks) the prototypes, else None."""

    def nms_extra_columns(self, model: BoxDetector) -> int:
        """How many columns after the class scores NMS carries along with each kept box (masks: the
        coefficients)."""

    def split_maps(self, maps: object) -> tuple[object, torch.Tensor | None]:
        """The raw head maps of ``forward_maps`` and (masks) the prototypes, else None."""

    def val_loss(self, criterion: Callable, maps: object, protos: torch.Tensor | None, targets: torch.Tensor,
                 batch: Batch, device: torch.device, pred_size: tuple[int, int]) -> None: ...

    def batch_label_masks(self, batch: Batch, dataset, targets: torch.Tensor) -> list[torch.Tensor] | None: ...

    def plot_label_masks(self, batch: Batch) -> torch.Tensor | None: ...

    def val_stats(self, nc: int, rules: ScoringRules) -> DetectionStats: ...

    def read_label_masks(self, label_masks: list[torch.Tensor] | None, dataset, first: int, count: int,
                         shape: tuple[int, int], resized: np.ndarray,
                         pads: np.ndarray) -> list[torch.Tensor] | None: ...

    def score_image(self, stats: DetectionStats, det: torch.Tensor, det_native: torch.Tensor, gt_boxes: torch.Tensor,
                    gt_cls: torch.Tensor, proto: torch.Tensor | None, label_masks: torch.Tensor | None,
                    shape: tuple[int, int]) -> None:
        """Add one image to ``stats``: ``det`` as NMS gave it, ``det_native`` and ``gt_boxes`` its detections and
        labels in the pixels ``stats.rules`` compares boxes in (the original image's, or the batch's)."""

    def original_masks(self, proto: torch.Tensor | None, det: torch.Tensor, det_native: torch.Tensor,
                       input_hw: tuple[int, int], pad: np.ndarray, resized: np.ndarray, original_hw: tuple[int, int],
                       rle: bool, polygons: bool) -> tuple[list[dict] | None, list[np.ndarray] | None]: ...

    def label_rows(self, det: torch.Tensor, polygons: list[np.ndarray] | None, shape: tuple[int, int],
                   with_conf: bool) -> str: ...

    def coco_label_fields(self, dataset) -> dict:
        """The task's own keyword arguments of :func:`~yolotrain.eval.coco.coco_ground_truth` for ``dataset``'s
        labels (a segmentation model's ``polygons``); empty for boxes alone."""

    def coco_masks(self, metrics: Metrics, out_dir: Path) -> None: ...

    # Whether pycocotools scores the ``--save-json`` detections (else predictions.json is written alone).
    coco_scoring: bool

    def suppress(self, predictions: torch.Tensor, conf: float, iou: float, classes: Sequence[int] | None = None,
                 agnostic: bool = False, multi_label: bool = False, max_det: int = VAL_NMS.max_det,
                 num_extra: int = 0) -> list[torch.Tensor]:
        """The NMS of decoded predictions (see :func:`~yolotrain.nms.non_max_suppression`): one tensor per image,
        the boxes' columns first, then score, class and what the task's rows carry after them."""

    def label_boxes(self, labels: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        """The boxes of label rows (``targets[:, 2:]``: normalised to the ``(h, w)`` batch) in the batch's
        pixels, in the form the task's detections have them (xyxy; a rotated box's xywhr)."""

    def original_boxes(self, rows: torch.Tensor, gain: tuple[float, float], pad: tuple[float, float],
                       original_hw: tuple[int, int]) -> torch.Tensor:
        """Detections (or :meth:`label_boxes`) with their boxes moved from the letterboxed input to the original
        image's pixels (``x_input = x_original * gain + pad``), score and class kept."""

    def confusion_matrix(self, nc: int) -> ConfusionMatrix | None:
        """The confusion matrix val fills for ``--plots`` (None: the task draws none)."""

    def json_detections(self, det_native: torch.Tensor, image_id: int) -> list[dict]:
        """``--save-json``'s entries of one image's detections in original pixels."""

    def save_val_batch(self, out_dir: Path, index: int, batch: Batch, targets: torch.Tensor, dets: list[torch.Tensor],
                       names: list[str], overlap: bool, protos: torch.Tensor | None) -> None:
        """``val_batch{index}_labels.jpg`` and ``val_batch{index}_pred.jpg``: the batch with its labels, and with
        its detections (in the batch's pixels, as :meth:`suppress` gives them)."""


def validate_detections(
    task: DetectionValidation, model: BoxDetector, model_or_weights: ModelsOrWeights,
    data: str | os.PathLike | DataLoader, dev: torch.device, *, img_size: int | None, batch_size: int, conf: float,
    iou: float, max_det: int, rect: bool, workers: int | None, reduced_decode: bool, criterion: Callable | None,
    save_dir: str | os.PathLike | None, save_json: bool, plots: bool, verbose: bool, map_classes: bool, save_txt: bool,
    save_conf: bool, single_cls: bool, hooks: Callbacks,
) -> Metrics:
    """:func:`val`'s scoring of a detection-family model ready for inference on ``dev`` (see :func:`val` for
    the settings), with what differs between those tasks (masks) asked of ``task``."""
    # Exports fixed at one image size take square letterboxed batches, not rectangular ones.
    rect = rect and model.dynamic_size
    loader = data
    if not isinstance(data, DataLoader):
        # Rect batch shapes must suit the largest stride (64 on P6 models).
        stride = max(model.size_multiple, 32)
        size = model.default_img_size if img_size is None else img_size
        loader = build_val_loader(data, None if map_classes or single_cls else model.num_classes, size,
                                  batch_size, rect, workers, stride=stride, kind=task.dataset_kind,
                                  reduced_decode=reduced_decode)
    _check_ordered(loader)
    dataset = loader.dataset
    model_names = class_names(model.names, model.num_classes)
    if single_cls:
        names, class_map = [model_names[0] if len(model_names) == 1 else "object"], None
    else:
        names, class_map = _class_correspondence(model_names, list(getattr(dataset, "names", ())), map_classes)
    nc = len(names)
    out_dir = Path(save_dir) if save_dir is not None else None
    if (save_json or save_txt) and out_dir is None:
        raise ValueError("save_json and save_txt need a save_dir to write their files into")
    if out_dir is not None:
        refuse_overwriting_inputs([("--project/--name", out_dir)], weights_files(model_or_weights) + dataset_inputs(
            getattr(dataset, "im_files", ()), None if isinstance(data, DataLoader) else data))
    task.check_inference(model)
    with run_lock(out_dir):  # one writer per run folder, until its results are written
        scorer = _ImageScorer(dataset, nc, class_map, plots and out_dir is not None,
                              out_dir / "labels" if save_txt else None, save_conf, save_json,
                              lambda path, det: hooks.run("on_val_image_end", path, det), task,
                              scoring_rules(model))
        timers = {k: _Timer(dev) for k in ("preprocess", "inference", "nms")}
        loss_sum, batches = torch.zeros(len(getattr(criterion, "component_names", "box obj cls".split()))), 0
        dtype = model.dtype
        if criterion is not None and not hasattr(model, "forward_maps"):
            raise ValueError("the validation loss needs one torch model without test-time augmentation (it reads "
                             "the raw head maps)")
        seen, batch_index = 0, 0
        iterator = iter(loader)
        hooks.run("on_val_start", loader)
        bar = progress_bar(total=len(loader), desc="val", unit="batch")
        with torch.inference_mode():
            while True:
                with timers["preprocess"]:
                    batch = next(iterator, None)
                    if batch is not None:
                        imgs, targets = batch.imgs.to(dev, dtype, non_blocking=True), batch.targets.to(dev)
                        if single_cls:
                            targets = torch.cat((targets[:, :1], torch.zeros_like(targets[:, 1:2]), targets[:, 2:]), 1)
                if batch is None:
                    break
                b, _, h, w = imgs.shape
                hooks.run("on_val_batch_start", batch_index, imgs, targets)
                with timers["inference"]:
                    if model.end_to_end:  # an export with NMS inside
                        dets = model.detections(imgs, conf, iou, max_det, multi_label=True)
                    elif criterion is None:
                        preds, protos = task.infer(model, imgs)
                    else:
                        maps, protos = task.split_maps(model.forward_maps(imgs))
                        preds = model.head.decode(maps)
                if criterion is not None:
                    task.val_loss(criterion, maps, protos, targets, batch, dev, (h, w))
                    loss_sum += criterion.components.float().cpu()
                    batches += 1
                with timers["nms"]:
                    if not model.end_to_end:
                        # As the reference: one class means one suppression across all classes, then class 0.
                        dets = task.suppress(preds.float(), conf, iou, agnostic=single_cls, multi_label=True,
                                             max_det=max_det, num_extra=task.nms_extra_columns(model))
                    if single_cls:
                        dets = [torch.cat((d[:, :5], torch.zeros_like(d[:, 5:6]), d[:, 6:]), 1) for d in dets]

                label_masks = task.batch_label_masks(batch, dataset, targets)
                scorer.add_batch(dets, targets, seen, (h, w), protos, label_masks)
                if plots and out_dir is not None and batch_index < VAL_BATCH_PLOTS:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    task.save_val_batch(out_dir, batch_index, batch, targets,
                                        dets if class_map is None else [_remap(d, class_map.to(d.device))
                                                                        for d in dets],
                                        names, getattr(dataset, "overlap", True), protos)
                bar.update()
                hooks.run("on_val_batch_end", batch_index, imgs, targets, dets)
                seen += b
                batch_index += 1
                # Let this batch's tensors go before the next one is loaded and run, not after.
                batch = imgs = targets = preds = protos = maps = dets = label_masks = None
        bar.close()

        metrics = scorer.stats.compute(names)
        metrics.speed = {k: t.total / max(seen, 1) * 1e3 for k, t in timers.items()}
        if criterion is not None:
            components = (loss_sum / max(batches, 1)).tolist()
            metrics.loss = dict(zip(getattr(criterion, "component_names", ("box", "obj", "cls")), components))
        if verbose:
            print(metrics.table(per_class=nc < 50 or out_dir is not None))
            _print_speed(metrics.speed, (loader.batch_sampler.batch_size if loader.batch_sampler else b, 3,
                                         dataset.img_size, dataset.img_size))
        if out_dir is not None:
            _save_results(metrics, scorer, names, out_dir)
        hooks.run("on_val_end", metrics)
        return metrics


class _ImageScorer:
    """Scores each image's detections against its labels in original-image pixels, and collects or
    writes what the options ask for: the confusion matrix, COCO detections, YOLO label files. With ``rules`` that
    say so, boxes are scored in the batch's pixels instead (everything else stays in original pixels)."""

    def __init__(self, dataset, nc: int, class_map: torch.Tensor | None, confusion: bool,
                 labels_dir: Path | None, save_conf: bool, save_json: bool,
                 image_end: Callable[[str, torch.Tensor], None], task: DetectionValidation,
                 rules: ScoringRules) -> None:
        self.dataset, self.class_map, self.image_end = dataset, class_map, image_end
        self.task = task
        self.stats = task.val_stats(nc, rules)
        self.confusion = task.confusion_matrix(nc) if confusion else None
        self.labels_dir, self.save_conf = labels_dir, save_conf
        self.coco_ids = image_ids(dataset.im_files) if save_json else None
        self.coco_dets: list[dict] = []
        if labels_dir is not None:
            labels_dir.mkdir(parents=True, exist_ok=True)
            # Images of equal names in different folders get labels/x.txt, labels/x_2.txt ... in dataset order.
            self.label_stems = unique_stems([Path(f).stem for f in dataset.im_files])

    def add_batch(self, dets: list[torch.Tensor], targets: torch.Tensor, first: int, shape: tuple[int, int],
                  protos: torch.Tensor | None = None, label_masks: list[torch.Tensor] | None = None) -> None:
        """``dets`` (per image, xyxy in the ``(h, w)`` batch's pixels, then a segmentation model's mask
        coefficients) and the batch's ``targets`` rows (image, class, normalised cx cy w h) of the images
        from index ``first`` of the dataset; a segmentation model's prototypes ``protos [B, nm, h', w']``
        and per image the masks of its labels, in the order of its rows in ``targets`` (None: read from
        the label files)."""
        b = len(dets)
        gains, pads = batch_geometry(self.dataset, first, b, shape)
        resized = np.round(np.asarray(gains) * np.asarray(self.dataset.shapes[first:first + b], dtype=np.float64))
        label_masks = self.task.read_label_masks(label_masks, self.dataset, first, b, shape, resized, pads)
        counts = torch.bincount(targets[:, 0].long(), minlength=b).tolist()
        order = targets[:, 0].argsort(stable=True)
        per_image = targets[order].split(counts)
        gt_pixels = self.task.label_boxes(targets[order][:, 2:], shape).split(counts)
        class_map = self.class_map.to(targets.device) if self.class_map is not None else None
        for i in range(b):
            w0, h0 = (int(v) for v in self.dataset.shapes[first + i])
            geometry = (tuple(gains[i]), tuple(pads[i]), (h0, w0))
            det = dets[i] if class_map is None else _remap(dets[i], class_map)
            det_native = self.task.original_boxes(det, *geometry)
            gt_boxes = self.task.original_boxes(gt_pixels[i], *geometry)
            gt_cls = per_image[i][:, 1]
            proto = None if protos is None else protos[i]
            scored, scored_gt = ((det[:, :det_native.shape[1]], gt_pixels[i]) if self.stats.rules.input_pixels
                                 else (det_native, gt_boxes))
            self.task.score_image(self.stats, det, scored, scored_gt, gt_cls, proto,
                                  None if label_masks is None else label_masks[i], shape)
            self.image_end(self.dataset.im_files[first + i], det_native)
            if self.confusion is not None:
                self.confusion.update(det_native, gt_boxes, gt_cls)
            outputs = self.coco_ids is not None or self.labels_dir is not None
            rles, polygons = None, None
            if outputs:
                rles, polygons = self.task.original_masks(proto, det, det_native, shape, pads[i], resized[i], (h0, w0),
                                                          self.coco_ids is not None, self.labels_dir is not None)
            if self.coco_ids is not None:
                found = self.task.json_detections(det_native.cpu(), self.coco_ids[first + i])
                for item, rle in zip(found, rles or ()):
                    item[self.task.coco_result_field] = rle
                self.coco_dets += found
            if self.labels_dir is not None:
                stem = self.label_stems[first + i]
                rows = self.task.label_rows(det_native, polygons, (h0, w0), self.save_conf)
                (self.labels_dir / f"{stem}.txt").write_text(rows)


def _save_results(metrics: Metrics, scorer: _ImageScorer, names: list[str], out_dir: Path) -> None:
    """Plots, COCO evaluation (when its detections were collected) and ``metrics.json`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if scorer.confusion is not None:
        metrics.confusion = scorer.confusion
        plot_confusion_matrix(scorer.confusion, names, out_dir / "confusion_matrix.png")
        if metrics.curves is not None:
            plot_curves(metrics, out_dir)
    if scorer.coco_ids is not None and not scorer.task.coco_scoring:  # detections with no COCO scorer
        (out_dir / "predictions.json").write_text(json.dumps(scorer.coco_dets))
    elif scorer.coco_ids is not None:
        metrics.coco = _coco_eval(scorer.dataset, names, scorer.coco_dets, out_dir,
                                  scorer.task.coco_label_fields(scorer.dataset))
        scorer.task.coco_masks(metrics, out_dir)
    (out_dir / "metrics.json").write_text(json.dumps(metrics.as_dict(), indent=2))


def _class_correspondence(model_names: list[str], data_names: list[str],
                          map_classes: bool) -> tuple[list[str], torch.Tensor | None]:
    """The class names results are reported under, and (with ``map_classes``) the model-to-data class map."""
    if not data_names or len(data_names) == len(model_names):
        return (data_names or model_names), None
    if not map_classes:
        raise ValueError(f"the model predicts {len(model_names)} classes but the data has {len(data_names)}: "
                         "scores would be meaningless; use weights trained on these classes, or map the model's "
                         "classes to the data's by name (--map-classes)")
    for side, names in (("model", model_names), ("data", data_names)):
        repeats = repeated_names(names)
        if repeats:
            raise ValueError(f"--map-classes matches classes by name, but the {side}'s {describe_repeats(repeats)}")
    index = {name: i for i, name in enumerate(data_names)}
    class_map = torch.tensor([index.get(name, -1) for name in model_names])
    if not bool((class_map >= 0).any()):
        raise ValueError(f"none of the data's classes ({', '.join(data_names[:5])} ...) is among the model's")
    return data_names, class_map


def _remap(det: torch.Tensor, class_map: torch.Tensor) -> torch.Tensor:
    """Detections with model class ids replaced by data class ids; classes the data lacks are dropped."""
    mapped = class_map[det[:, 5].long()]
    keep = mapped >= 0
    return torch.cat((det[keep, :5], mapped[keep, None].to(det.dtype), det[keep, 6:]), 1)


def _coco_eval(dataset, names: list[str], detections: list[dict], out_dir: Path,
               label_fields: dict | None = None) -> list[float]:
    """Write COCO ground truth (with the task's own fields of each label: a segmentation model's polygons,
    see :func:`~yolotrain.eval.coco.coco_ground_truth`) and detections, evaluate the boxes and return the 12
    summary numbers."""
    gt = coco_ground_truth(dataset.im_files, dataset.labels, dataset.shapes, names, **(label_fields or {}))
    gt_path, pred_path = out_dir / "ground_truth.json", out_dir / "predictions.json"
    gt_path.write_text(json.dumps(gt))
    pred_path.write_text(json.dumps(detections))
    return coco_evaluate(gt_path, pred_path)


# Options of the reference's val.py that yolotrain does not have, and why: each stops the command in one
# line rather than being ignored. docs/coming-from-yolov5.md lists them.
UNSUPPORTED_VAL_OPTIONS = {
    "--save-hybrid": "label+prediction hybrid files are not written: they mix the labels into the detections, "
                     "so a mAP over them is not the model's",
    "--dnn": "ONNX models run with ONNX Runtime, not OpenCV DNN",
}
# The settings val() takes as keywords (the others say what to evaluate and where the run folder goes).
_RUN_ONLY = ("weights", "data", "project", "name", "exist_ok", "classes", "agnostic")


def add_val_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``yolotrain val`` options (:class:`ValConfig`, the reference's spellings) to ``parser``."""
    add_arguments(parser, ValConfig, skip=("classes", "agnostic"), required=("weights",))
    # The reference's --verbose asks for the per-class table, which the command always prints.
    parser.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    add_refused(parser, UNSUPPORTED_VAL_OPTIONS)
    return parser


def val_config(args: argparse.Namespace) -> ValConfig:
    """The validated :class:`ValConfig` of parsed ``val`` options; a refused reference option is one line."""
    check_refused(args, UNSUPPORTED_VAL_OPTIONS)
    names = flat_names(ValConfig)
    return from_flat(ValConfig, {k: v for k, v in vars(args).items() if k in names})


def trained_on(weights: str) -> str:
    """The dataset a checkpoint of ours was trained on, which ``val`` without ``--data`` validates on (as
    Ultralytics' ``val`` does); it says so in one line.

    Raises:
        ValueError: ``weights`` is no checkpoint of ours naming a dataset (an official ``.pt``, an export), or
            the dataset it names is not here.
    """
    try:
        dataset = read_metadata(weights)[0].get("dataset") or {}
    except CheckpointError:
        dataset = {}
    path = dataset.get("path") if isinstance(dataset, dict) else None
    if not isinstance(path, str):
        raise ValueError(f"--data is needed: {weights} does not name the dataset it was trained on")
    if not Path(path).exists():
        raise ValueError(f"--data is needed: {weights} was trained on {shown_path(path)}, which is not here")
    print(f"Data: {path} (what {weights} was trained on; --data for another)")
    return path


def run_val(args: argparse.Namespace) -> int:
    """Run ``yolotrain val`` from parsed arguments; returns the process exit code."""
    config = val_config(args)
    weights = weights_argument(config.weights)
    data = config.data if config.data is not None else trained_on(config.weights[0])
    speed = config.mode == "speed"
    save_dir = None if speed else next_run_dir(config.project, config.name, config.exist_ok)
    keywords = {k: v for k, v in flat_values(config).items() if k not in _RUN_ONLY}
    metrics = val(weights, data, save_dir=save_dir, **keywords)
    if speed:
        return 0
    print(f"Results saved to {save_dir}")
    return 0 if math.isfinite(metrics.fitness()) else 1
