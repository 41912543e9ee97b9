"""Costs of matching tracks to detections, and the optimal one-to-one matching under a largest cost."""

from __future__ import annotations

import numpy as np

IOU_EPS = 1e-7


def iou_cost(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``1 - IoU`` of boxes ``a [n, 4]`` and ``b [m, 4]`` (x1, y1, x2, y2), computed in float32."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    if not len(a) or not len(b):
        return np.ones((len(a), len(b)), dtype=np.float32)
    wh = (np.minimum(a[:, None, 2:], b[None, :, 2:]) - np.maximum(a[:, None, :2], b[None, :, :2])).clip(0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return 1 - inter / (area_b + area_a[:, None] - inter + IOU_EPS)


def fused_cost(cost: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``1 - IoU * score``: a weak detection is a worse match than a confident one at the same overlap."""
    return 1 - (1 - cost) * scores[None, :]


def assign(cost: np.ndarray, thresh: float) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """The matching of rows to columns with the least total cost among pairs costing at most ``thresh``
    (Jonker-Volgenant, as the published trackers solve it); returns the ``(row, column)`` pairs and the
    unmatched rows and columns, each in ascending order.

    Raises:
        ImportError: the ``lap`` package (``pip install yolotrain[track]``) is missing.
    """
    rows, cols = cost.shape
    if cost.size == 0:
        return [], list(range(rows)), list(range(cols))
    try:
        import lap
    except ImportError:
        raise ImportError("tracking needs the lap package: pip install 'yolotrain[track]'") from None
    _, row_to_col, col_to_row = lap.lapjv(cost, extend_cost=True, cost_limit=thresh)
    matches = [(int(r), int(c)) for r, c in enumerate(row_to_col) if c >= 0]
    return matches, np.flatnonzero(row_to_col < 0).tolist(), np.flatnonzero(col_to_row < 0).tolist()
