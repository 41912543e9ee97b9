"""Multi-object tracking: ByteTrack and BoT-SORT over the detector's per-frame results."""

from .config import TrackerConfig, tracker_config
from .trackers import BotSort, ByteTracker, Tracks, make_tracker

__all__ = ["BotSort", "ByteTracker", "TrackerConfig", "Tracks", "make_tracker", "tracker_config"]
