"""Building blocks of the anchor-free YOLO family (YOLOv5u, YOLOv8, YOLO11) that the YOLOv5 blocks lack.

Conv, C3, SPPF and Concat are the YOLOv5 ones (:mod:`yolotrain.model.blocks`): the same layers under the same
attribute names, with the BatchNorm settings (eps 1e-3, momentum 0.03) the reference re-initialises its
detectors with. The blocks here keep the reference's attribute names too (``cv1``, ``m``, ``attn``, ``ffn`` ...),
so its ``state_dict`` files load unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import Conv


class Bottleneck(nn.Module):
    """Two convolutions of the given kernel sizes, with a residual connection when shapes allow and
    ``shortcut`` (the YOLOv5 Bottleneck is this one with kernels (1, 3))."""

    def __init__(self, c_in: int, c_out: int, shortcut: bool = True, groups: int = 1,
                 kernels: tuple[int, int] = (3, 3), expansion: float = 0.5) -> None:
        super().__init__()
        hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, hidden, kernels[0], 1)
        self.cv2 = Conv(hidden, c_out, kernels[1], 1, groups=groups)
        self.add = shortcut and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP bottleneck with two convolutions (YOLOv8): the first splits into two halves, ``depth`` bottlenecks
    run one after another on the second, and every intermediate output is concatenated into the last."""

    def __init__(self, c_in: int, c_out: int, depth: int = 1, shortcut: bool = False, groups: int = 1,
                 expansion: float = 0.5) -> None:
        super().__init__()
        self.c = int(c_out * expansion)
        self.cv1 = Conv(c_in, 2 * self.c, 1, 1)
        self.cv2 = Conv((2 + depth) * self.c, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut, groups, (3, 3), 1.0) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = list(self.cv1(x).chunk(2, 1))
        for block in self.m:
            outputs.append(block(outputs[-1]))
        return self.cv2(torch.cat(outputs, 1))


class C2(nn.Module):
    """CSP bottleneck with two convolutions (the YOLOv8 P6 neck): bottlenecks on one half only."""

    def __init__(self, c_in: int, c_out: int, depth: int = 1, shortcut: bool = True, groups: int = 1,
                 expansion: float = 0.5) -> None:
        super().__init__()
        self.c = int(c_out * expansion)
        self.cv1 = Conv(c_in, 2 * self.c, 1, 1)
        self.cv2 = Conv(2 * self.c, c_out, 1)
        self.m = nn.Sequential(*(Bottleneck(self.c, self.c, shortcut, groups, (3, 3), 1.0) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).chunk(2, 1)
        return self.cv2(torch.cat((self.m(a), b), 1))


class C3k(nn.Module):
    """The C3 block (two branches, bottlenecks on one) with bottlenecks of a chosen kernel size (YOLO11)."""

    def __init__(self, c_in: int, c_out: int, depth: int = 1, shortcut: bool = True, groups: int = 1,
                 expansion: float = 0.5, kernel: int = 3) -> None:
        super().__init__()
        hidden = int(c_out * expansion)
        self.cv1 = Conv(c_in, hidden, 1, 1)
        self.cv2 = Conv(c_in, hidden, 1, 1)
        self.cv3 = Conv(2 * hidden, c_out, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, groups, (kernel, kernel), 1.0)
                                 for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C3k2(C2f):
    """C2f whose inner blocks are bottlenecks, or with ``c3k`` two-bottleneck C3k blocks (YOLO11; the
    reference turns ``c3k`` on for its m, l and x scales)."""

    def __init__(self, c_in: int, c_out: int, depth: int = 1, c3k: bool = False, expansion: float = 0.5,
                 groups: int = 1, shortcut: bool = True) -> None:
        super().__init__(c_in, c_out, depth, shortcut, groups, expansion)
        self.m = nn.ModuleList(C3k(self.c, self.c, 2, shortcut, groups) if c3k else
                               Bottleneck(self.c, self.c, shortcut, groups) for _ in range(depth))


class Attention(nn.Module):
    """Multi-head self-attention over the pixels of a feature map, with a depthwise 3x3 positional encoding of
    the values added to its output (YOLO11's PSA). Queries and keys have ``attn_ratio`` of a head's channels."""

    def __init__(self, dim: int, num_heads: int = 8, attn_ratio: float = 0.5) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim ** -0.5
        self.qkv = Conv(dim, dim + 2 * self.key_dim * num_heads, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, 1, groups=dim, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        # Per head, the channels are its query, key and value rows in that order (the reference's layout).
        q, k, v = self.qkv(x).view(b, self.num_heads, 2 * self.key_dim + self.head_dim, h * w).split(
            (self.key_dim, self.key_dim, self.head_dim), 2)
        weights = ((q * self.scale).transpose(-2, -1) @ k).softmax(-1)  # [B, heads, HW, HW]
        attended = (v @ weights.transpose(-2, -1)).view(b, c, h, w)
        return self.proj(attended + self.pe(v.reshape(b, c, h, w)))


class PSABlock(nn.Module):
    """Attention then a two-convolution feed-forward, each added to its input with ``shortcut``."""

    def __init__(self, c: int, attn_ratio: float = 0.5, num_heads: int = 4, shortcut: bool = True) -> None:
        super().__init__()
        self.attn = Attention(c, num_heads, attn_ratio)
        self.ffn = nn.Sequential(Conv(c, c * 2, 1), Conv(c * 2, c, 1, act=False))
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x) if self.add else self.attn(x)
        return x + self.ffn(x) if self.add else self.ffn(x)


class C2PSA(nn.Module):
    """CSP block with ``depth`` PSA blocks (attention over the pixels) on one half of its channels (YOLO11)."""

    def __init__(self, c_in: int, c_out: int, depth: int = 1, expansion: float = 0.5) -> None:
        super().__init__()
        if c_in != c_out:
            raise ValueError(f"C2PSA keeps its channels, got {c_in} -> {c_out}")
        self.c = int(c_in * expansion)
        self.cv1 = Conv(c_in, 2 * self.c, 1, 1)
        self.cv2 = Conv(2 * self.c, c_in, 1)
        self.m = nn.Sequential(*(PSABlock(self.c, attn_ratio=0.5, num_heads=max(self.c // 64, 1))
                                 for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).split((self.c, self.c), 1)
        return self.cv2(torch.cat((a, self.m(b)), 1))


class DFL(nn.Module):
    """Distribution focal loss integral: the expected value of a softmax over ``reg_max`` bins per box side.

    The bins' values 0 … reg_max-1 are the weights of a fixed 1x1 convolution (a parameter that is never
    trained, as the reference keeps it: its checkpoints hold it and its parameter counts include it)."""

    def __init__(self, reg_max: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(reg_max, 1, 1, bias=False).requires_grad_(False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.arange(reg_max, dtype=torch.float32).view(1, reg_max, 1, 1))
        self.c1 = reg_max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, 4*reg_max, N]`` distributions (logits, side-major) → ``[B, 4, N]`` distances in grid units."""
        b, _, n = x.shape
        # The bins in the input's dtype: decoding runs in float32 whatever the weights' precision (bf16 would keep
        # 8 significant bits of each distance); the bins 0 … reg_max-1 are exact in every float type.
        probabilities = x.view(b, 4, self.c1, n).transpose(2, 1).softmax(1)
        return F.conv2d(probabilities, self.conv.weight.to(x.dtype)).view(b, 4, n)
