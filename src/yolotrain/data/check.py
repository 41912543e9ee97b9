"""Dataset check: verification summary, a preview of augmented training samples with their boxes (and
masks, for polygon labels), and label statistics (class counts, box sizes); for a classification dataset
(class folders), each split's images per class, corrupt images named, and a preview of training samples
labelled with their class."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import cv2
import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
import numpy as np
import torch

from ..boxes import xywh_to_xyxy
from ..draw import class_colour, draw_detections, draw_keypoints, draw_masks, object_masks
from ..outputs import dataset_inputs, refuse_overwriting_inputs
from ..progress import progress_bar
from .augment import AugmentConfig
from .classify import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ClassifyAugment,
    ClassifyDataset,
    SplitCheck,
    check_split,
    empty_class_folders,
    is_classify_folder,
    resolve_classify_source,
    split_samples,
)
from .dataset import DetectionDataset
from .loaders import DataConfig, build_loaders
from .sources import resolve_source
from .verify import DataWarning, VerifyReport

# Side of the preview's tiles and images per preview of a classification dataset.
CLASSIFY_IMG_SIZE = 224
CLASSIFY_PREVIEW_TILES = 16
DETECT_IMG_SIZE = 640


@dataclass
class CheckResult:
    """Verification reports of both splits and the written image files."""

    train: VerifyReport
    val: VerifyReport
    preview: Path
    stats: Path


def draw_sample(img_rgb: np.ndarray, labels: np.ndarray, names: list[str],
                masks: np.ndarray | None = None, overlap: bool = True,
                keypoints: np.ndarray | None = None) -> np.ndarray:
    """A BGR copy of a dataset sample with its labels (class + normalised cx, cy, w, h) drawn and named, a
    segmentation sample's target masks (``overlap``: a ``[1, h, w]`` numbered map, else ``[n, h, w]``)
    blended in their class colours, and a pose sample's ``keypoints`` ``[n, K, D]`` (x, y normalised)."""
    h, w = img_rgb.shape[:2]
    image = cv2.cvtColor(img_rgb, cv2.COLOR_RGB2BGR)
    if masks is not None:
        image = draw_masks(image, object_masks(masks, len(labels), (h, w), overlap), labels[:, 0])
    boxes = xywh_to_xyxy(torch.from_numpy(labels[:, 1:5]).double()) * torch.tensor([w, h, w, h])
    image = draw_detections(image, boxes, labels[:, 0], names)
    if keypoints is None:
        return image
    points = np.asarray(keypoints, np.float64).copy()
    points[..., :2] *= (w, h)
    return draw_keypoints(image, points)


def save_preview(dataset: DetectionDataset, path: Path, n: int = 4) -> Path:
    """Write a grid of the first ``n`` (augmented) samples of ``dataset`` with boxes and names (and masks,
    for a :class:`~yolotrain.data.segment.SegmentationDataset`; keypoints, for a
    :class:`~yolotrain.data.pose.PoseDataset`)."""
    samples = [dataset[i % len(dataset)] for i in range(n)]
    overlap = getattr(dataset, "overlap", True)
    tiles = [draw_sample(s[0], s[1], dataset.names, s[4] if len(s) == 5 else None, overlap,
                         s[2] if len(s) == 3 else None) for s in samples]
    size = dataset.img_size
    tiles = [cv2.resize(t, (size, size)) if t.shape[:2] != (size, size) else t for t in tiles]
    cols = int(np.ceil(np.sqrt(n)))
    rows = -(-n // cols)
    tiles += [np.full_like(tiles[0], 114)] * (rows * cols - n)
    grid = np.vstack([np.hstack(tiles[r * cols:(r + 1) * cols]) for r in range(rows)])
    cv2.imwrite(str(path), grid)
    return path


def save_label_stats(labels: list[np.ndarray], names: list[str], path: Path) -> Path:
    """Plot the labels' statistics to ``path`` (PNG or JPEG), as the reference's ``labels.jpg``: instances of
    each class, the box centres (x vs y) and the box sizes (width vs height), as fractions of the image."""
    all_labels = np.concatenate(labels) if labels else np.zeros((0, 5))
    nc = max(len(names), int(all_labels[:, 0].max()) + 1 if len(all_labels) else 1)
    counts = np.bincount(all_labels[:, 0].astype(int), minlength=nc)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.5))
    ax1.bar(np.arange(nc), counts, color=[np.array(class_colour(c)[::-1]) / 255 for c in range(nc)])
    ax1.set_title(f"instances per class ({len(all_labels)} boxes)")
    ax1.set_ylabel("instances")
    if nc <= 30:
        ax1.set_xticks(np.arange(nc), [names[i] if i < len(names) else str(i) for i in range(nc)],
                      rotation=60, ha="right", fontsize=8)
    for ax, (x, y), (xlabel, ylabel) in ((ax2, (1, 2), ("x", "y")), (ax3, (3, 4), ("width", "height"))):
        ax.hist2d(all_labels[:, x], all_labels[:, y], bins=40, range=[[0, 1], [0, 1]], cmap="Blues")
        ax.set_title(f"box {'centre' if x == 1 else 'size'}: {xlabel} vs {ylabel} (fraction of image)")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
    ax2.invert_yaxis()  # image rows grow downwards
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


@dataclass
class ClassifyCheckResult:
    """What checking a class-folder dataset found: the class names, each split folder's verification and
    usable images per class, and the written image files."""

    names: list[str]
    splits: dict[str, SplitCheck]
    images: dict[str, np.ndarray]  # split folder -> [nc] usable images of each class
    preview: Path
    stats: Path


def draw_class_sample(image: torch.Tensor, name: str, index: int) -> np.ndarray:
    """A BGR uint8 picture of a normalised classification sample ``[3, S, S]`` with its class name written
    at its top left in the class's colour."""
    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    rgb = ((image * std + mean) * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    tile = np.ascontiguousarray(rgb[..., ::-1])
    thickness = max(round(tile.shape[0] * 0.006), 1)
    scale, font = thickness / 2.5, cv2.FONT_HERSHEY_SIMPLEX
    (tw, th), baseline = cv2.getTextSize(name, font, scale, thickness)
    cv2.rectangle(tile, (0, 0), (tw + 4, th + baseline + 4), class_colour(index), -1)
    cv2.putText(tile, name, (2, th + 2), font, scale, (255, 255, 255), thickness, cv2.LINE_AA)
    return tile


def preview_indices(labels: np.ndarray, n: int) -> list[int]:
    """Up to ``n`` sample indices taking the classes in turn (each class's images in order), so the preview
    shows every class before it shows any twice."""
    by_class = [np.flatnonzero(labels == c).tolist() for c in np.unique(labels)]
    chosen: list[int] = []
    for rank in range(max(map(len, by_class), default=0)):
        chosen += [members[rank] for members in by_class if rank < len(members)]
    return chosen[:n]


def save_class_preview(dataset: ClassifyDataset, path: Path, n: int = CLASSIFY_PREVIEW_TILES) -> Path:
    """Write a grid of up to ``n`` samples of ``dataset`` (as its loader makes them: augmented for training),
    the classes in turn, each labelled with its class name."""
    tiles = [draw_class_sample(dataset[i][0], dataset.names[int(dataset.labels[i])], int(dataset.labels[i]))
             for i in preview_indices(dataset.labels, n)]
    cols = int(np.ceil(np.sqrt(len(tiles))))
    rows = -(-len(tiles) // cols)
    tiles += [np.full_like(tiles[0], 114)] * (rows * cols - len(tiles))
    cv2.imwrite(str(path), np.vstack([np.hstack(tiles[r * cols:(r + 1) * cols]) for r in range(rows)]))
    return path


def save_class_counts(images: dict[str, np.ndarray], names: list[str], path: Path) -> Path:
    """Plot the images of each class, a bar per split side by side, to ``path``."""
    nc, width = len(names), 0.8 / max(len(images), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, min(0.4 * nc, 24.0)), 4.5))
    for k, (split, counts) in enumerate(images.items()):
        ax.bar(np.arange(nc) + (k - (len(images) - 1) / 2) * width, counts, width,
               label=f"{split} ({int(counts.sum())} images)")
    ax.set_title(f"images per class ({nc} classes)")
    ax.set_ylabel("images")
    if nc <= 50:
        ax.set_xticks(np.arange(nc), names, rotation=60, ha="right", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def class_table(names: list[str], images: dict[str, np.ndarray]) -> str:
    """Images of each class in each split, one row per class."""
    width = max(12, *(len(n) + 2 for n in names))
    rows = [f"{'class':>{width}}" + "".join(f"{split:>10}" for split in images)]
    rows += [f"{name:>{width}}" + "".join(f"{int(counts[c]):>10}" for counts in images.values())
             for c, name in enumerate(names)]
    return "\n".join(rows)


def check_classify_dataset(data: str | os.PathLike, out_dir: str | os.PathLike,
                           img_size: int = CLASSIFY_IMG_SIZE, seed: int = 0) -> ClassifyCheckResult:
    """Verify every split folder of a class-folder dataset (``train/``, ``val/``, ``test/``; cached as training
    verifies them), print each one's summary with its corrupt images named and the images of each class, and
    write ``train_preview.png`` (training samples as augmented for training, labelled with their class; the
    evaluated split's centre crops when there is no ``train/``) and ``class_counts.png`` into ``out_dir``."""
    out = Path(out_dir)
    source = resolve_classify_source(data, splits=())
    samples = {split: split_samples(source.root / split, source.names) for split in source.folders}
    for split, found in samples.items():  # training refuses these; the check names them and goes on
        empty = empty_class_folders(source.root / split, found, source.names)
        if empty:
            warnings.warn(f"{source.root / split}: {len(empty)} class folder(s) without an image: {', '.join(empty)} "
                          "(training refuses them)", DataWarning, stacklevel=2)
    refuse_overwriting_inputs([("--out", out)], dataset_inputs([p for s in samples.values() for p, _ in s], data))
    # A step per split verified and per picture drawn; the findings are printed once the bar is done.
    with progress_bar(total=len(source.folders) + 2, desc="data check", unit="step") as steps:
        checks = {}
        for split in source.folders:
            steps.set_postfix_str(f"verifying {split}")
            checks[split] = check_split(samples[split], source.root / split)
            steps.update()
        images = {split: np.bincount([label for _, label in check.kept], minlength=len(source.names))
                  for split, check in checks.items()}
        out.mkdir(parents=True, exist_ok=True)
        shown = "train" if "train" in checks else source.eval_split
        augment = ClassifyAugment() if shown == "train" else None
        preview_set = ClassifyDataset(checks[shown].kept, img_size, augment, seed, names=source.names)
        steps.set_postfix_str("preview")
        preview = save_class_preview(preview_set, out / "train_preview.png")
        steps.update()
        steps.set_postfix_str("class counts")
        stats = save_class_counts(images, source.names, out / "class_counts.png")
        steps.update()
    for split, check in checks.items():
        print(check.summary(split))
    print(class_table(source.names, images))
    print(f"wrote {preview} and {stats}")
    return ClassifyCheckResult(source.names, checks, images, preview, stats)


def check_dataset(
    data: str | os.PathLike, out_dir: str | os.PathLike, num_classes: int | None = None,
    img_size: int | None = None, seed: int = 0,
) -> CheckResult | ClassifyCheckResult:
    """Verify a dataset (folder or YAML), print the summary of each split, and write
    ``mosaic_preview.png`` (augmented training samples with boxes and class names, and masks for polygon
    labels) and ``label_stats.png`` (class counts, box w/h distribution) into ``out_dir``; a folder of class
    folders is checked by :func:`check_classify_dataset`. ``img_size``: 640 (224 for class folders).

    ``num_classes`` defaults to the number of class names in the dataset; without names, class ids
    are not range-checked.
    """
    if os.path.isdir(data) and is_classify_folder(data):
        return check_classify_dataset(data, out_dir, img_size or CLASSIFY_IMG_SIZE, seed)
    img_size = img_size or DETECT_IMG_SIZE
    out = Path(out_dir)
    config = DataConfig(path=os.fspath(data), img_size=img_size, batch_size=1, workers=0, cache_mb=0)
    # Three steps: verification, the preview, the statistics; the findings are printed once the bar is done.
    with progress_bar(total=3, desc="data check", unit="step") as steps:
        steps.set_postfix_str("verifying")
        with warnings.catch_warnings():  # the summaries are printed below; no need to repeat them as warnings
            warnings.simplefilter("ignore", DataWarning)
            # A pose dataset's rows are read as keypoints (its YAML's kpt_shape), and previewed with them.
            kind = "keypoints" if resolve_source(data).keypoints is not None else "boxes"
            loaders = build_loaders(config, AugmentConfig(), num_classes=num_classes, seed=seed, kind=kind)
        train, val = loaders.train_index, loaders.val_index
        refuse_overwriting_inputs([("--out", out)], dataset_inputs([*train.files, *val.files], data))
        out.mkdir(parents=True, exist_ok=True)
        steps.update()
        steps.set_postfix_str("preview")
        preview_set = loaders.train.dataset
        if train.has_polygons:  # a YOLO-seg dataset: the preview shows the masks its training draws
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DataWarning)
                preview_set = build_loaders(config, AugmentConfig(), num_classes=num_classes, seed=seed,
                                            splits=("train",), kind="masks").train.dataset
        preview = save_preview(preview_set, out / "mosaic_preview.png")
        steps.update()
        steps.set_postfix_str("label statistics")
        stats = save_label_stats(train.labels, loaders.names, out / "label_stats.png")
        steps.update()
    print(train.report.summary("train"))
    if val is not train:
        print(val.report.summary("val"))
    print(f"wrote {preview} and {stats}")
    return CheckResult(train.report, val.report, preview, stats)
