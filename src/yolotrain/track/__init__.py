"""Multi-object tracking: ByteTrack and BoT-SORT over the detector's per-frame results."""

from .config import TrackerConfig, tracker_config
from .result import TrackResult
from .run import TrackConfig, track
from .trackers import BotSort, ByteTracker, Tracks, make_tracker

__all__ = ["BotSort", "ByteTracker", "TrackConfig", "TrackResult", "TrackerConfig", "Tracks", "make_tracker", "track",
           "tracker_config"]
