"""Tracker settings: one typed section with the published ByteTrack and BoT-SORT defaults (the values
of ultralytics' ``bytetrack.yaml`` and ``botsort.yaml``), chosen by name or read from a YAML file in
that same form."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..settings import ConfigError, from_mapping, setting
from ..yamlio import read_yaml

TRACKER_NAMES = ("bytetrack", "botsort")


@dataclass(frozen=True)
class TrackerConfig:
    """How detections are joined into tracks. BoT-SORT is ByteTrack with a box-size Kalman state and
    camera-motion compensation; the ReID settings are the published ones, with ReID off."""

    tracker_type: Literal["bytetrack", "botsort"] = setting("bytetrack", "bytetrack or botsort")
    track_high_thresh: float = setting(0.25, "detections scoring at least this are matched first", min=0, max=1)
    track_low_thresh: float = setting(0.1, "detections scoring above this (and below track_high_thresh) are "
                                      "matched second, to tracks left over", min=0, max=1)
    new_track_thresh: float = setting(0.25, "an unmatched detection scoring at least this starts a track",
                                      min=0, max=1)
    track_buffer: int = setting(30, "frames a lost track is kept to be found again", min=0)
    match_thresh: float = setting(0.8, "largest matching cost (1 - IoU, times the score with fuse_score) of "
                                  "the first match", min=0, max=1)
    fuse_score: bool = setting(True, "weigh the first match's IoU by the detection score")
    gmc_method: Literal["sparseOptFlow", "none"] = setting(
        "sparseOptFlow", "botsort: camera-motion compensation (sparse optical flow) or none")
    proximity_thresh: float = setting(0.5, "botsort ReID: least IoU for an appearance match", min=0, max=1)
    appearance_thresh: float = setting(0.8, "botsort ReID: least appearance similarity", min=0, max=1)
    with_reid: bool = setting(False, "botsort: appearance features (not implemented: must stay false)")

    def __post_init__(self) -> None:
        if self.with_reid:
            raise ConfigError("with_reid: re-identification features are not implemented; set with_reid: false "
                              "(BoT-SORT then matches by motion and IoU, as its published default does)")
        if self.track_low_thresh > self.track_high_thresh:
            raise ConfigError(f"track_low_thresh ({self.track_low_thresh:g}) must not exceed track_high_thresh "
                              f"({self.track_high_thresh:g})")


def tracker_config(tracker: str | os.PathLike | TrackerConfig = "bytetrack") -> TrackerConfig:
    """The settings ``tracker`` names: ``bytetrack`` or ``botsort`` (the published defaults), a YAML file of
    settings (``tracker_type`` required; missing settings keep the defaults; ultralytics' tracker YAMLs
    read unchanged), or a :class:`TrackerConfig`.

    Raises:
        ConfigError: an unknown tracker name, a setting with a wrong name or value.
        FileNotFoundError: the YAML file does not exist.
    """
    if isinstance(tracker, TrackerConfig):
        return tracker
    text = os.fspath(tracker)
    if text in TRACKER_NAMES:
        return TrackerConfig(tracker_type=text)
    path = Path(text)
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError(f"--tracker {text}: expected bytetrack, botsort or a tracker YAML file")
    if not path.is_file():
        raise FileNotFoundError(f"tracker file not found: {text}")
    values = read_yaml(path)
    if not isinstance(values, dict) or "tracker_type" not in values:
        raise ConfigError(f"{text}: a tracker YAML needs tracker_type: bytetrack or botsort")
    values = dict(values)
    # ultralytics' files name the ReID model; "auto" (the detector's own features) only matters with ReID.
    if values.get("model", "auto") == "auto":
        values.pop("model", None)
    try:
        return from_mapping(TrackerConfig, values)
    except ConfigError as error:
        raise ConfigError(f"{text}: {error}") from None

