"""The constant-velocity Kalman filter of SORT-style trackers, over many tracks at once.

A track's state is its box and the box's velocity, ``[x, y, s1, s2, vx, vy, vs1, vs2]`` with ``(x, y)``
the box centre. ByteTrack measures the size as aspect ratio and height (``xyah``), BoT-SORT as width and
height (``xywh``). Every noise level is proportional to the box's size (its height, or its width for
the width and horizontal terms), so a distant small object and a near large one are followed alike.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Parametrisation = Literal["xyah", "xywh"]

# Standard deviations as shares of the box size: position (measurement and motion) and velocity.
POSITION_WEIGHT = 1 / 20
VELOCITY_WEIGHT = 1 / 160
# xyah: the aspect ratio's own fixed noise levels (it is unitless, so not scaled by the box).
ASPECT_STD = {"initial": 1e-2, "initial_velocity": 1e-5, "motion": 1e-2, "motion_velocity": 1e-5, "measurement": 1e-1}


class KalmanFilter:
    """Initiate, predict and update ``n`` tracks at once: ``means [n, 8]``, ``covs [n, 8, 8]`` (float64)."""

    def __init__(self, parametrisation: Parametrisation) -> None:
        self.parametrisation = parametrisation
        # x' = x + v: the state's motion over one frame.
        self.motion = np.eye(8)
        self.motion[:4, 4:] = np.eye(4)
        # Velocities that a lost track stops extrapolating (its size stays as last seen; ByteTrack keeps
        # the aspect ratio's, which has no unit to blow up).
        self.size_velocities = [7] if parametrisation == "xyah" else [6, 7]

    def _std(self, boxes: np.ndarray, weight: float, aspect_std: float) -> np.ndarray:
        """Per-box standard deviations of the 4 box terms, ``weight`` times the size they scale with."""
        if self.parametrisation == "xyah":
            std = np.repeat(boxes[:, 3:4] * weight, 4, axis=1)
            std[:, 2] = aspect_std
            return std
        return boxes[:, [2, 3, 2, 3]] * weight

    def measurement(self, tlwh: np.ndarray) -> np.ndarray:
        """Boxes ``[n, 4]`` left, top, width, height as the filter measures them (``xyah`` or ``xywh``)."""
        out = np.array(tlwh, copy=True)
        out[:, :2] += out[:, 2:] / 2
        if self.parametrisation == "xyah":
            out[:, 2] /= out[:, 3]
        return out

    def xyxy(self, means: np.ndarray) -> np.ndarray:
        """The boxes of states ``[n, 8]`` as x1, y1, x2, y2."""
        box = means[:, :4].copy()
        if self.parametrisation == "xyah":
            box[:, 2] *= box[:, 3]
        box[:, :2] -= box[:, 2:] / 2
        box[:, 2:] += box[:, :2]
        return box

    def initiate(self, measurements: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """New states at the measured boxes, standing still, uncertain in proportion to their size."""
        z = np.asarray(measurements, dtype=np.float64)
        means = np.concatenate([z, np.zeros_like(z)], axis=1)
        std = np.concatenate([self._std(z, 2 * POSITION_WEIGHT, ASPECT_STD["initial"]),
                              self._std(z, 10 * VELOCITY_WEIGHT, ASPECT_STD["initial_velocity"])], axis=1)
        return means, _diagonal(np.square(std))

    def predict(self, means: np.ndarray, covs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """States one frame later."""
        std = np.concatenate([self._std(means, POSITION_WEIGHT, ASPECT_STD["motion"]),
                              self._std(means, VELOCITY_WEIGHT, ASPECT_STD["motion_velocity"])], axis=1)
        means = means @ self.motion.T
        covs = self.motion @ covs @ self.motion.T + _diagonal(np.square(std))
        return means, covs

    def update(self, means: np.ndarray, covs: np.ndarray, measurements: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """States corrected by their measured boxes ``[n, 4]`` (in :meth:`measurement`'s form)."""
        std = self._std(means, POSITION_WEIGHT, ASPECT_STD["measurement"])
        projected_cov = covs[:, :4, :4] + _diagonal(np.square(std))
        # K = P Hᵀ S⁻¹, from the solve S Kᵀ = H P (P symmetric).
        gain = np.swapaxes(np.linalg.solve(projected_cov, covs[:, :4, :]), 1, 2)
        innovation = np.asarray(measurements, dtype=np.float64) - means[:, :4]
        means = means + np.einsum("nij,nj->ni", gain, innovation)
        covs = covs - gain @ projected_cov @ np.swapaxes(gain, 1, 2)
        return means, covs


def _diagonal(values: np.ndarray) -> np.ndarray:
    """``[n, k]`` → ``[n, k, k]`` diagonal matrices."""
    out = np.zeros((*values.shape, values.shape[-1]))
    index = np.arange(values.shape[-1])
    out[:, index, index] = values
    return out
