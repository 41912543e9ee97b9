"""Global motion compensation for BoT-SORT: how the camera moved between two frames, as a 2x3
similarity transform (rotation, uniform scale, translation) estimated from sparse optical flow.

Corners found in the previous frame (at half resolution) are followed into the new one with
pyramidal Lucas-Kanade flow, and a similarity is fitted to the pairs with RANSAC, so moving objects
count as outliers. Where too few corners are followed, or no transform fits, the camera is taken to
be still (the identity).
"""

from __future__ import annotations

import cv2
import numpy as np

# cv2.goodFeaturesToTrack settings: enough corners to over-determine the 4-parameter transform (each
# costs one flow solve); corners may sit on neighbouring pixels (minDistance 0).
CORNER_PARAMS = {"maxCorners": 400, "qualityLevel": 0.01, "minDistance": 0, "blockSize": 3,
                 "useHarrisDetector": False, "k": 0.04}
DOWNSCALE = 2
MIN_POINTS = 5  # a transform is fitted to at least this many followed corners


class SparseFlowMotion:
    """Feed frames in order to :meth:`apply`; each call answers the camera motion since the previous one."""

    def __init__(self) -> None:
        self._previous: np.ndarray | None = None
        self._corners: np.ndarray | None = None

    def reset(self) -> None:
        self._previous = self._corners = None

    def apply(self, image: np.ndarray) -> np.ndarray:
        """The 2x3 transform taking points of the previous frame to ``image`` (BGR or grey); the identity
        for the first frame, or when the frame size changed."""
        grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if image.ndim == 3 and image.shape[2] == 3 else image
        h, w = grey.shape[:2]
        grey = cv2.resize(grey, (w // DOWNSCALE, h // DOWNSCALE))
        corners = cv2.goodFeaturesToTrack(grey, mask=None, **CORNER_PARAMS)
        warp = np.eye(2, 3)
        if self._previous is not None and self._corners is not None and self._previous.shape == grey.shape:
            warp = self._estimate(self._previous, grey, self._corners)
        self._previous, self._corners = grey, corners
        return warp

    @staticmethod
    def _estimate(previous: np.ndarray, current: np.ndarray, corners: np.ndarray) -> np.ndarray:
        followed, status, _ = cv2.calcOpticalFlowPyrLK(previous, current, corners, None)
        good = status.ravel().astype(bool)
        if good.sum() < MIN_POINTS:
            return np.eye(2, 3)
        warp = cv2.estimateAffinePartial2D(corners[good], followed[good], method=cv2.RANSAC)[0]
        if warp is None:
            return np.eye(2, 3)
        warp[:, 2] *= DOWNSCALE  # translation back to full-resolution pixels
        return warp


def warp_states(means: np.ndarray, covs: np.ndarray, warp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kalman states ``[n, 8]`` (``xywh`` form) and covariances moved with the camera by ``warp``: centres
    and velocities rotated, scaled and shifted; sizes scaled by the transform's magnitudes (never
    flipped in sign)."""
    rotation = warp[:, :2]
    transform = np.kron(np.eye(4), rotation)
    transform[2:4, 2:4] = transform[6:8, 6:8] = np.abs(rotation)
    means = means @ transform.T
    means[:, :2] += warp[:, 2]
    covs = transform @ covs @ transform.T
    return means, covs
