"""AutoAnchor: how well a model's anchors fit a dataset's boxes, and better anchors when they fit poorly.

The reference's recipe and numbers. A box fits an anchor when neither side ratio exceeds the loss's
``anchor_t``; the best possible recall (BPR) is the share of boxes that fit at least one anchor.
Below a BPR of 0.98, new anchors come from k-means on the (log) box sizes, refined by a mutation-only
genetic search on the reference's fitness (mean best ratio of the fitting boxes), and replace the
old ones only when their BPR is higher.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

# The reference refits anchors below this best possible recall.
BPR_THRESHOLD = 0.98
# Genetic search: generations, share of values mutated, mutation scale; the reference's values.
GENERATIONS = 1000
MUTATION_PROB = 0.9
MUTATION_SIGMA = 0.1
# Boxes below this many pixels on both sides are left out of the fit (the reference's filter).
MIN_BOX_PIXELS = 2.0
# k-means restarts and iteration cap.
KMEANS_RESTARTS = 10
KMEANS_ITERATIONS = 100
# Boxes the refit uses at most: each of the 1000 generations compares every box with every anchor,
# so a million-box label set took minutes; from a seeded sample of this many it takes about 10 s on
# 2 CPU cores (coco128 has 929 boxes, COCO train2017 860k).
MAX_FIT_BOXES = 10_000


@dataclass(frozen=True)
class AnchorCheck:
    """What :func:`check_anchors` found: anchors per target and BPR before, BPR after, and whether the
    model now holds new anchors (``anchors``, pixels, ``[levels * na, 2]``)."""

    anchors_per_target: float
    bpr_before: float
    bpr_after: float
    replaced: bool
    anchors: np.ndarray

    def summary(self) -> str:
        """One line for the training log."""
        head = (f"AutoAnchor: {self.anchors_per_target:.2f} anchors/target, best possible recall (BPR) "
                f"{self.bpr_before:.4f}")
        if self.bpr_before > BPR_THRESHOLD:
            return f"{head}: the anchors fit the data"
        if self.replaced:
            return f"{head} -> {self.bpr_after:.4f} with new anchors from k-means and evolution (saved with the model)"
        return f"{head}; new anchors reach only {self.bpr_after:.4f}, keeping the current ones"


def label_sizes(shapes: np.ndarray, labels: Sequence[np.ndarray], img_size: int,
                scale: np.ndarray | None = None) -> np.ndarray:
    """(w, h) in pixels, ``[n, 2]`` float32, of every box once its image is loaded with its long side
    at ``img_size``.

    Args:
        shapes: original image sizes ``[images, 2]`` as (w, h).
        labels: per image ``[k, 5]`` rows (class, cx, cy, w, h), normalised.
        scale: optional per-image size factor ``[images]`` or ``[images, 1]``.
    """
    shapes = np.asarray(shapes, dtype=np.float64).reshape(-1, 2)
    loaded = img_size * shapes / shapes.max(1, keepdims=True)
    if scale is not None:
        loaded = loaded * np.asarray(scale, dtype=np.float64).reshape(-1, 1)
    counts = [len(rows) for rows in labels]
    if not sum(counts):
        return np.zeros((0, 2), dtype=np.float32)
    wh = np.concatenate([np.asarray(rows, dtype=np.float64).reshape(-1, 5)[:, 3:5] for rows in labels])
    return (wh * np.repeat(loaded, counts, axis=0)).astype(np.float32)


def _ratio_metric(wh: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """``[boxes, anchors]``: the worse of the two side ratios (≤ 1) of each box to each anchor."""
    r = wh[:, None] / anchors[None].astype(np.float32)
    return np.minimum(r, 1 / r).min(2)


def anchor_fit(anchors: np.ndarray, wh: np.ndarray, anchor_t: float) -> tuple[float, float]:
    """(best possible recall, mean number of anchors each box fits) of ``anchors`` (pixels) on ``wh``."""
    x = _ratio_metric(wh, np.asarray(anchors).reshape(-1, 2))
    fits = x > 1 / anchor_t
    return float(fits.any(1).mean()), float(fits.sum(1).mean())


def anchor_fitness(anchors: np.ndarray, wh: np.ndarray, anchor_t: float) -> float:
    """The reference's evolution fitness: mean over boxes of the best ratio, counted only where it fits."""
    best = _ratio_metric(wh, np.asarray(anchors).reshape(-1, 2)).max(1)
    return float((best * (best > 1 / anchor_t)).mean())


def _kmeans(points: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Lloyd's k-means from k-means++ seeds; the lowest-distortion result of several restarts."""
    best, best_distortion = None, np.inf
    for _ in range(KMEANS_RESTARTS):
        centres = points[rng.integers(len(points))][None]
        for _ in range(1, k):
            d2 = ((points[:, None] - centres[None]) ** 2).sum(2).min(1)
            total = d2.sum()
            pick = rng.choice(len(points), p=d2 / total) if total > 0 else rng.integers(len(points))
            centres = np.concatenate((centres, points[pick][None]))
        for _ in range(KMEANS_ITERATIONS):
            nearest = ((points[:, None] - centres[None]) ** 2).sum(2).argmin(1)
            counts = np.bincount(nearest, minlength=k)
            sums = np.stack([np.bincount(nearest, weights=points[:, j], minlength=k) for j in range(2)], 1)
            moved = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], centres)
            if np.allclose(moved, centres):
                break
            centres = moved
        distortion = np.sqrt(((points[:, None] - centres[None]) ** 2).sum(2).min(1)).mean()
        if distortion < best_distortion:
            best, best_distortion = centres, distortion
    return best


def kmean_anchors(wh: np.ndarray, n: int, img_size: int, anchor_t: float, rng: np.random.Generator,
                  generations: int = GENERATIONS) -> np.ndarray:
    """``n`` anchors (pixels, ``[n, 2]``, smallest area first) fitted to the box sizes ``wh``: k-means
    on the log sizes, then the reference's genetic search on :func:`anchor_fitness`."""
    wh = wh[(wh >= MIN_BOX_PIXELS).any(1)].astype(np.float32)
    log_wh = np.log(np.maximum(wh, 1e-3)).astype(np.float64)
    anchors = None
    if len(wh) >= n and (log_wh.std(0) > 0).all():
        # The fit is a size ratio, so clusters are formed on log sizes, where equal ratios are equal
        # distances (the reference clusters whitened pixel sizes; on coco128 at 320 this starts the
        # search at fitness 0.69 instead of 0.62).
        anchors = np.exp(_kmeans(log_wh, n, rng))
        if len(np.unique(anchors.round(6), axis=0)) < n:
            anchors = None  # too few distinct sizes for n clusters
    if anchors is None:
        anchors = np.sort(rng.random(n * 2)).reshape(n, 2) * img_size
    fitness = anchor_fitness(anchors, wh, anchor_t)
    for _ in range(generations):
        factor = np.ones(anchors.shape)
        while (factor == 1).all():  # mutate until something changes
            factor = ((rng.random(anchors.shape) < MUTATION_PROB) * rng.random() * rng.standard_normal(anchors.shape)
                      * MUTATION_SIGMA + 1).clip(0.3, 3.0)
        candidate = (anchors * factor).clip(min=MIN_BOX_PIXELS)
        candidate_fitness = anchor_fitness(candidate, wh, anchor_t)
        if candidate_fitness > fitness:
            anchors, fitness = candidate, candidate_fitness
    return anchors[np.argsort(anchors.prod(1))].astype(np.float32)


def check_anchors(model: nn.Module, shapes: np.ndarray, labels: Sequence[np.ndarray], img_size: int,
                  anchor_t: float, seed: int = 0, generations: int = GENERATIONS,
                  log: Callable[[str], None] | None = None) -> AnchorCheck:
    """Check the anchors of ``model`` against a dataset and replace them when a refit is better.

    As the reference does, the check draws a random 0.9–1.1 size factor per image (the scale
    augmentation), the refit uses the plain sizes, and new anchors are kept only if their BPR on the
    same scaled sizes is higher. The new anchors are written into the model's head (sorted by area,
    so the smallest go to the finest level); everything random is drawn from ``seed``. Beyond
    :data:`MAX_FIT_BOXES` boxes the refit (not the recall check) uses a sample of them drawn from
    ``seed``; ``log`` gets a line before a refit starts.
    """
    head = getattr(model, "module", model).head
    stride = head.stride.detach().cpu().double().view(-1, 1, 1)
    current = (head.anchors.detach().cpu().double() * stride).view(-1, 2).numpy()
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.9, 1.1, size=len(labels))
    scaled = label_sizes(shapes, labels, img_size, scale)
    if not len(scaled):
        return AnchorCheck(0.0, 1.0, 1.0, False, current)  # nothing to fit: keep the anchors
    bpr, per_target = anchor_fit(current, scaled, anchor_t)
    if bpr > BPR_THRESHOLD:
        return AnchorCheck(per_target, bpr, bpr, False, current)
    sizes = label_sizes(shapes, labels, img_size)
    sampled = ""
    if len(sizes) > MAX_FIT_BOXES:  # a generator of its own: smaller datasets draw exactly as before
        sizes = sizes[np.sort(np.random.default_rng([seed, len(sizes)]).choice(len(sizes), MAX_FIT_BOXES, False))]
        sampled = f" (a seeded sample of the {len(scaled)})"
    if log is not None:
        log(f"AutoAnchor refit: best possible recall {bpr:.4f} is below {BPR_THRESHOLD}, fitting new anchors to "
            f"{len(sizes)} boxes{sampled} in {generations} generations ...")
    fitted = kmean_anchors(sizes, len(current), img_size, anchor_t, rng, generations)
    new_bpr, _ = anchor_fit(fitted, scaled, anchor_t)
    if new_bpr <= bpr:
        return AnchorCheck(per_target, bpr, new_bpr, False, current)
    table = torch.as_tensor(fitted, dtype=torch.float64).view_as(head.anchors) / stride
    head.anchors = table.to(device=head.anchors.device, dtype=head.anchors.dtype)
    return AnchorCheck(per_target, bpr, new_bpr, True, fitted)
