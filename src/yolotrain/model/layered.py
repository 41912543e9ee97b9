"""What every YOLO detector built from a model YAML shares, whatever its head: layers run in order, each fed from
its ``from`` layers, the head last; the box-model protocol's properties read off the head and the parameters.
:class:`~yolotrain.model.Yolov5` (anchor-based) and :class:`~yolotrain.model.anchor_free.AnchorFreeYolo` extend it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .blocks import fuse_convs

# Precision names of the floating types a model's parameters may have (as exports name theirs).
PRECISIONS: dict[torch.dtype, str] = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# Published models trained at this input size, by their largest stride (P6 models at 1280).
DEFAULT_IMG_SIZE: dict[int, int] = {32: 640, 64: 1280}


class LayeredDetector(nn.Module):
    """A detector whose ``self.model`` (an ``nn.ModuleList`` in the layer indices of its YAML, so state-dict names are
    the reference's) ends in its head. Subclasses set ``model``, ``layer_inputs`` (each layer's ``from`` as absolute
    indices), ``saved_outputs`` (the layers whose outputs later layers reuse), ``max_stride``, ``in_channels``,
    ``version``, ``num_classes`` and ``task``, and define :meth:`forward`."""

    dynamic_size = True
    fixed_size = None
    end_to_end = False

    model: nn.ModuleList
    layer_inputs: list[int | list[int]]
    saved_outputs: set[int]
    max_stride: int
    in_channels: int
    version: str
    num_classes: int

    @property
    def head(self) -> nn.Module:
        return self.model[-1]

    @property
    def num_masks(self) -> int:
        """Mask coefficients per prediction, one per prototype mask (0 for a detector)."""
        return self.head.nm

    @property
    def num_protos(self) -> int:
        """Hidden channels of the prototype module (0 for a detector)."""
        return self.head.npr

    @property
    def stride(self) -> torch.Tensor:
        return self.head.stride

    @property
    def size_multiple(self) -> int:
        """Input sides are multiples of the largest stride (:attr:`max_stride`)."""
        return self.max_stride

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def precision(self) -> str:
        return PRECISIONS.get(self.dtype, str(self.dtype).removeprefix("torch."))

    @property
    def default_img_size(self) -> int:
        """The input size the published weights of this architecture were trained at (1280 for P6)."""
        return DEFAULT_IMG_SIZE.get(self.max_stride, 640)

    def forward_maps(self, imgs: torch.Tensor) -> list[torch.Tensor] | tuple[list[torch.Tensor], torch.Tensor]:
        """Raw head maps whatever the mode (validation loss needs them in eval mode too); with the
        prototype masks, ``(maps, proto)``, for a segmentation model."""
        return self.head(self._head_inputs(imgs))

    def _head_inputs(self, imgs: torch.Tensor) -> list[torch.Tensor]:
        """The feature maps the head (the last layer) takes, from every layer before it."""
        self._check_input(imgs)
        kept: dict[int, torch.Tensor] = {}
        x: Any = imgs
        for i, (layer, source) in enumerate(zip(self.model, self.layer_inputs)):
            if isinstance(source, list):
                x = [x if j == i - 1 else kept[j] for j in source]
            elif source != i - 1 and i > 0:
                x = kept[source]
            if i == len(self.model) - 1:
                return x
            x = layer(x)
            if i in self.saved_outputs:
                kept[i] = x
        raise AssertionError("the model has no layers")

    def _check_input(self, imgs: torch.Tensor) -> None:
        if imgs.ndim != 4 or imgs.shape[1] != self.in_channels:
            raise ValueError(f"expected images [B, {self.in_channels}, H, W], got shape {tuple(imgs.shape)}")
        h, w = imgs.shape[2:]
        if h % self.max_stride or w % self.max_stride:
            raise ValueError(f"image sides must be multiples of {self.max_stride}, got {h}x{w} "
                             "(letterbox or resize first)")

    def fuse(self) -> LayeredDetector:
        """Fold every BatchNorm into its convolution (inference only); returns self in eval mode."""
        fuse_convs(self)
        return self

    def extra_repr(self) -> str:
        return f"version={self.version!r}, num_classes={self.num_classes}, task={self.task!r}"
