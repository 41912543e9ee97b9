"""Building blocks of the YOLOv5 v6/v7 architecture: Conv-BN-SiLU, Bottleneck, C3, SPPF, Concat; and the
SPP and Focus blocks that older model YAMLs use.

Attribute names (``conv``, ``bn``, ``cv1``, ``m`` ...) follow the reference implementation so that
its ``state_dict`` files load into these modules unchanged.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_weights

# The reference re-initialises every BatchNorm with these values (utils/torch_utils.initialize_weights).
BN_EPS = 1e-3
BN_MOMENTUM = 0.03


def autopad(kernel: int, padding: int | None = None) -> int:
    """'Same' padding for an odd kernel at stride 1."""
    return kernel // 2 if padding is None else padding


class Conv(nn.Module):
    """Conv2d (no bias) → BatchNorm2d → SiLU; ``fuse()`` folds the BatchNorm into the convolution."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, stride: int = 1,
                 padding: int | None = None, groups: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, autopad(kernel, padding), groups=groups, bias=False)
        self.bn: nn.Module = nn.BatchNorm2d(c_out, eps=BN_EPS, momentum=BN_MOMENTUM)
        # Not in-place: SiLU's backward needs its input, which BatchNorm's output must keep intact.
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))

    def fuse(self) -> None:
        """Fold BatchNorm into the convolution for inference (the module must be in eval mode).

        The convolution takes new folded weight and bias parameters (the ones ``fuse_conv_bn_eval`` gives);
        its old parameters are left as they were. Unlike ``fuse_conv_bn_eval`` it does not copy the
        convolution first, which cost more than the folding (callers that must keep their model, as
        inference and export do, fuse a copy of the whole model)."""
        if isinstance(self.bn, nn.BatchNorm2d):
            bn = self.bn
            self.conv.weight, self.conv.bias = fuse_conv_bn_weights(
                self.conv.weight, self.conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
            self.bn = nn.Identity()


def fuse_convs(model: nn.Module) -> None:
    """Fold the BatchNorm of every :class:`Conv` in ``model`` into its convolution (inference only)."""
    model.eval()
    for module in model.modules():
        if isinstance(module, Conv):
            module.fuse()


class Bottleneck(nn.Module):
    """1x1 then 3x3 convolution, with a residual connection when shapes allow and ``shortcut``."""

    def __init__(self, c_in: int, c_out: int, shortcut: bool = True, expansion: float = 0.5) -> None:
        super().__init__()
        hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, hidden, 1, 1)
        self.cv2 = Conv(hidden, c_out, 3, 1)
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP bottleneck with three convolutions: two branches, ``depth`` bottlenecks on one of them."""

    def __init__(self, c_in: int, c_out: int, depth: int = 1, shortcut: bool = True) -> None:
        super().__init__()
        hidden = int(c_out * 0.5)
        self.cv1 = Conv(c_in, hidden, 1, 1)
        self.cv2 = Conv(c_in, hidden, 1, 1)
        self.cv3 = Conv(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, expansion=1.0) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools stand in for 5/9/13 parallel pools."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 5) -> None:
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1, 1)
        self.cv2 = Conv(hidden * 4, c_out, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=kernel, stride=1, padding=kernel // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class SPP(nn.Module):
    """Spatial pyramid pooling: parallel max-pools of several sizes, concatenated with their input."""

    def __init__(self, c_in: int, c_out: int, kernels: tuple[int, ...] = (5, 9, 13)) -> None:
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1, 1)
        self.cv2 = Conv(hidden * (len(kernels) + 1), c_out, 1, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2) for k in kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        return self.cv2(torch.cat([x, *(pool(x) for pool in self.m)], 1))


class Focus(nn.Module):
    """Space-to-depth (each 2x2 pixel block becomes 4 channels), then a Conv: the pre-v6.0 stem."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, stride: int = 1, padding: int | None = None,
                 groups: int = 1) -> None:
        super().__init__()
        self.conv = Conv(c_in * 4, c_out, kernel, stride, padding, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), 1))


class Concat(nn.Module):
    """Concatenate a list of feature maps along channels (a module so layer indices match the reference)."""

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, 1)
