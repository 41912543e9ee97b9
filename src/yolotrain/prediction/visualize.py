"""Feature maps of a PyTorch model's layers, saved per predicted image as the reference's ``detect.py
--visualize`` saves them (``utils/plots.py feature_visualization``): for every layer but the head whose
output is a feature map taller and wider than one cell, ``stage{i}_{Module}_features.png`` (a grid of
its first 32 channels, 8 a row) and ``stage{i}_{Module}_features.npy`` (every channel), of the first
image of the batch.

The maps are read by forward hooks on the layers, so the model's own forward is run unchanged."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import torch
from torch import nn

from ..eval.slicing import SlicedDetector
from ..eval.tta import AugmentedDetector, EnsembleDetector
from ..task import task_of

MAX_CHANNELS = 32  # channels drawn per layer, as the reference draws them
GRID_COLUMNS = 8
TILE_PIXELS = 128  # small maps are enlarged (nearest neighbour, whole multiples) to at least this side
GAP_PIXELS = 4  # white space between tiles


def visualized_layers(model: object) -> list[tuple[int, str, nn.Module]]:
    """``(stage, module name, module)`` of each layer of ``model`` but the head: a detector's or segmentation
    model's layers by their index in its YAML (the reference's ``m.i``), a classifier's by their place in
    its network.

    Raises:
        ValueError: ``model`` is an export (ONNX, OpenVINO, ...), which has no layers to look into.
    """
    if task_of(model).is_pytorch_model(model):
        layers = list(model.model.children())[:-1]
        return [(stage, type(layer).__name__, layer) for stage, layer in enumerate(layers)]
    if isinstance(model, (AugmentedDetector, EnsembleDetector, SlicedDetector)):
        what = {AugmentedDetector: "test-time augmentation", EnsembleDetector: "an ensemble of several weights",
                SlicedDetector: "sliced inference"}[type(model)]
        raise ValueError(f"--visualize shows one model's layers on the image as given; with {what} the maps of "
                         "which forward would it be? Run --visualize without --augment or --slice and with one "
                         "--weights")
    kind = getattr(model, "format_name", None) or type(model).__name__
    raise ValueError(f"--visualize looks into the layers of a PyTorch model; this {kind} export has none to look "
                     "into: predict with the .pt/.safetensors weights")


class FeatureMaps:
    """Forward hooks on the layers of ``model`` (:func:`visualized_layers`) that keep the first image's
    feature maps of the first forward after each :meth:`save` (test-time augmentation's later passes see
    flipped or scaled copies of the image). The hooks stay on ``model`` for its life: give it a model of
    its own (:func:`~yolotrain.prediction.run.predict` gives its copy of the weights)."""

    def __init__(self, model: object) -> None:
        self.captured: dict[int, tuple[str, torch.Tensor]] = {}
        for stage, name, layer in visualized_layers(model):
            layer.register_forward_hook(self._keeper(stage, name))

    def _keeper(self, stage: int, name: str):
        def keep(module: nn.Module, inputs: tuple, output: object) -> None:
            if stage in self.captured or not isinstance(output, torch.Tensor):
                return
            if output.ndim == 4 and output.shape[2] > 1 and output.shape[3] > 1:
                # A copy: a later in-place activation may overwrite the layer's output.
                self.captured[stage] = (name, output[0].detach().to("cpu", torch.float32, copy=True))
        return keep

    def save(self, folder: Path) -> list[Path]:
        """Write the kept maps into ``folder`` (made if missing) and forget them; returns the files written."""
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for stage, (name, maps) in sorted(self.captured.items()):
            stem = folder / f"stage{stage}_{name}_features"
            np.save(stem.with_suffix(".npy"), maps.numpy())
            cv2.imwrite(str(stem.with_suffix(".png")), feature_grid(maps[:MAX_CHANNELS].numpy()))
            written += [stem.with_suffix(".png"), stem.with_suffix(".npy")]
        self.captured.clear()
        return written


def feature_grid(maps: np.ndarray) -> np.ndarray:
    """``maps`` ``[n, h, w]`` as one BGR image: ``GRID_COLUMNS`` tiles a row, each channel scaled to its own
    range and coloured with viridis (as matplotlib's ``imshow`` shows them), white between tiles."""
    n, h, w = maps.shape
    maps = np.nan_to_num(maps.astype(np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    low = maps.min(axis=(1, 2), keepdims=True)
    span = maps.max(axis=(1, 2), keepdims=True) - low
    levels = np.where(span > 0, (maps - low) / np.where(span > 0, span, 1) * 255, 0).round().astype(np.uint8)
    rows = math.ceil(n / GRID_COLUMNS)
    blank = rows * GRID_COLUMNS - n
    levels = np.concatenate([levels, np.zeros((blank, h, w), np.uint8)])
    shown = np.concatenate([np.ones((n, h, w), bool), np.zeros((blank, h, w), bool)])
    scale = max(1, math.ceil(TILE_PIXELS / max(h, w)))
    tiles = levels.repeat(scale, 1).repeat(scale, 2)
    shown = shown.repeat(scale, 1).repeat(scale, 2)
    gap = ((0, 0), (0, GAP_PIXELS), (0, GAP_PIXELS))
    tiles, shown = np.pad(tiles, gap), np.pad(shown, gap)
    th, tw = tiles.shape[1:]

    def as_grid(t: np.ndarray) -> np.ndarray:
        return t.reshape(rows, GRID_COLUMNS, th, tw).transpose(0, 2, 1, 3).reshape(rows * th, GRID_COLUMNS * tw)

    image = cv2.applyColorMap(as_grid(tiles), cv2.COLORMAP_VIRIDIS)
    image[~as_grid(shown)] = 255
    return image[:-GAP_PIXELS, :-GAP_PIXELS]
