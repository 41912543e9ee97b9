"""The tracks of one frame: a prediction result whose boxes carry track ids."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..prediction.run import Result


@dataclass
class TrackResult(Result):
    """The confirmed tracks of one image or frame, in original image pixels.

    As :class:`~yolotrain.prediction.run.Result`, with ``ids`` ``[n]`` (long, from 1 per sequence) for the
    ``boxes`` (each track's Kalman estimate after this frame's match), ``scores`` and ``classes`` (those of
    the detection it matched); ``sequence`` names the video, stream or folder of frames, and ``mot_frame``
    is the 1-based frame number of the MOTChallenge files.
    """

    ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    sequence: str = ""
    mot_frame: int = 0

    def to_dict(self) -> dict:
        out = super().to_dict()
        for det, track_id in zip(out["detections"], self.ids.tolist()):
            det["id"] = track_id
        out["sequence"], out["mot_frame"] = self.sequence, self.mot_frame
        out["tracks"] = out.pop("detections")
        return out

    def yolo_lines(self) -> list[str]:
        """Rows ``class cx cy w h score id`` normalised to the image."""
        return [f"{line} {track_id}" for line, track_id in zip(super().yolo_lines(), self.ids.tolist())]

    def mot_lines(self) -> list[str]:
        """MOTChallenge rows ``frame, id, left, top, width, height, score, -1, -1, -1``."""
        b = self.boxes.double()
        return [f"{self.mot_frame},{i},{x1:.2f},{y1:.2f},{x2 - x1:.2f},{y2 - y1:.2f},{s:.5f},-1,-1,-1"
                for i, (x1, y1, x2, y2), s in zip(self.ids.tolist(), b.tolist(), self.scores.tolist())]
