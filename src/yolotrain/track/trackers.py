"""ByteTrack and BoT-SORT: detections of each frame joined into tracks with stable ids.

ByteTrack (Zhang et al., 2022) predicts every track with a Kalman filter and matches it to the
detections by IoU in two rounds: first the confident detections, then the weak ones (which are
mostly occluded objects) to the tracks still unmatched. A detection matched by nothing starts a
track, confirmed when it is matched again in the next frame; a track unmatched for ``track_buffer``
frames is dropped, and until then can be found again under its id. BoT-SORT (Aharon et al., 2022)
is the same with a Kalman state of box width and height instead of aspect ratio and height, and the
camera's own motion (global motion compensation) taken out of the predictions first.

The bookkeeping (which pools a track moves through and when) follows the published implementation
(and ultralytics' trackers, which the tests compare ids with frame by frame), quirks included: a
track dropped for age is still matchable in the frame after, and a re-found track can be
dropped in the frame it is lost again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from .config import TrackerConfig
from .gmc import SparseFlowMotion, warp_states
from .kalman import KalmanFilter
from .matching import assign, fused_cost, iou_cost

SECOND_MATCH_THRESH = 0.5  # largest 1 - IoU of the second round (weak detections, plain IoU)
UNCONFIRMED_MATCH_THRESH = 0.7  # largest cost of a new track's confirming match
DUPLICATE_IOU_COST = 0.15  # a tracked and a lost track overlapping more than IoU 0.85 are one object
REMOVED_MEMORY = 1000  # ids of dropped tracks remembered (a lost track with such an id is not kept)


class TrackState(IntEnum):
    NEW = 0
    TRACKED = 1
    LOST = 2
    REMOVED = 3


@dataclass(eq=False)
class Track:
    """A detection, and once started, a track: its Kalman state and the detection it was last matched to."""

    tlwh: np.ndarray  # float32 left, top, width, height of the detection
    score: float
    cls: int
    det_index: int  # the detection's index in its frame
    mean: np.ndarray | None = None
    cov: np.ndarray | None = None
    track_id: int = 0
    state: TrackState = TrackState.NEW
    activated: bool = False  # confirmed: shown and matched first
    start_frame: int = 0
    frame: int = 0  # the last frame it was matched in

    def take(self, det: Track, frame: int) -> None:
        """Take over a matched detection's score, class and index (the tracker updates its Kalman state)."""
        self.score, self.cls, self.det_index, self.frame = det.score, det.cls, det.det_index, frame
        self.state, self.activated = TrackState.TRACKED, True


@dataclass(frozen=True)
class Tracks:
    """The confirmed tracks of one frame, all matched in it: ``boxes [n, 4]`` x1, y1, x2, y2 (the Kalman
    estimate), ``ids``, ``scores``, ``classes`` and ``det_index`` (each track's detection in the frame)."""

    boxes: np.ndarray
    ids: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    det_index: np.ndarray


class ByteTracker:
    """Call :meth:`update` with each frame's detections, in order; :meth:`reset` before another video."""

    parametrisation = "xyah"

    def __init__(self, config: TrackerConfig | None = None) -> None:
        self.config = config or TrackerConfig()
        self.kalman = KalmanFilter(self.parametrisation)
        self.reset()

    def reset(self) -> None:
        self.tracked: list[Track] = []
        self.lost: list[Track] = []
        self.removed_ids: deque[int] = deque(maxlen=REMOVED_MEMORY)
        self.frame = 0
        self._last_id = 0

    def update(self, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray,
               image: np.ndarray | None = None) -> Tracks:
        """Match one frame's detections (``boxes [n, 4]`` x1, y1, x2, y2 pixels) to the tracks; ``image``
        (BGR) is what BoT-SORT estimates camera motion from."""
        self.frame += 1
        cfg = self.config
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        scores = np.asarray(scores, dtype=np.float32).reshape(-1)
        classes = np.asarray(classes).reshape(-1)
        # Centre and size first, then the corner: the measured box, as the published trackers derive it.
        wh = boxes[:, 2:] - boxes[:, :2]
        tlwh = np.concatenate([(boxes[:, :2] + boxes[:, 2:]) / 2 - wh / 2, wh], axis=1)
        valid = (wh > 0).all(axis=1)  # a box without area has no aspect ratio to measure
        high = valid & (scores >= cfg.track_high_thresh)
        low = valid & (scores > cfg.track_low_thresh) & (scores < cfg.track_high_thresh)
        detections = [Track(tlwh[i], scores[i], int(classes[i]), int(i)) for i in np.flatnonzero(high)]
        weak = [Track(tlwh[i], scores[i], int(classes[i]), int(i)) for i in np.flatnonzero(low)]

        unconfirmed = [t for t in self.tracked if not t.activated]
        confirmed = [t for t in self.tracked if t.activated]
        pool = _union(confirmed, self.lost)
        self._predict(pool)
        self._compensate_camera(image, pool, unconfirmed)
        activated: list[Track] = []
        refound: list[Track] = []
        lost: list[Track] = []
        removed: list[Track] = []

        # 1. Confirmed and lost tracks with the confident detections.
        matches, left_tracks, left_dets = assign(self._cost(pool, detections), cfg.match_thresh)
        self._apply(matches, pool, detections, activated, refound)
        # 2. Tracks still unmatched (not the lost ones) with the weak detections.
        remaining = [pool[i] for i in left_tracks if pool[i].state == TrackState.TRACKED]
        matches, unmatched, _ = assign(iou_cost(self._boxes(remaining), self._boxes(weak)), SECOND_MATCH_THRESH)
        self._apply(matches, remaining, weak, activated, refound)
        for i in unmatched:
            remaining[i].state = TrackState.LOST
            lost.append(remaining[i])
        # 3. Last frame's new tracks with the confident detections left: confirmed, or dropped.
        detections = [detections[i] for i in left_dets]
        matches, unmatched, left_dets = assign(self._cost(unconfirmed, detections), UNCONFIRMED_MATCH_THRESH)
        self._apply(matches, unconfirmed, detections, activated, refound)
        for i in unmatched:
            unconfirmed[i].state = TrackState.REMOVED
            removed.append(unconfirmed[i])
        # 4. New tracks from confident detections matched by nothing.
        for i in left_dets:
            if detections[i].score >= cfg.new_track_thresh:
                self._start(detections[i])
                activated.append(detections[i])
        # 5. Lost tracks too old to be found again.
        for track in self.lost:
            if self.frame - track.frame > cfg.track_buffer:
                track.state = TrackState.REMOVED
                removed.append(track)
        self._merge(activated, refound, lost, removed)
        return self._output()

    def _cost(self, tracks: list[Track], detections: list[Track]) -> np.ndarray:
        cost = iou_cost(self._boxes(tracks), self._boxes(detections))
        if self.config.fuse_score:
            cost = fused_cost(cost, np.array([d.score for d in detections], dtype=np.float32))
        return cost

    def _boxes(self, tracks: list[Track]) -> np.ndarray:
        """x1, y1, x2, y2 of tracks (their Kalman estimate) or of detections (as measured)."""
        if not tracks:
            return np.zeros((0, 4), dtype=np.float32)
        if tracks[0].mean is None:
            tlwh = np.stack([t.tlwh for t in tracks])
            return np.concatenate([tlwh[:, :2], tlwh[:, :2] + tlwh[:, 2:]], axis=1)
        return self.kalman.xyxy(np.stack([t.mean for t in tracks])).astype(np.float32)

    def _predict(self, tracks: list[Track]) -> None:
        if not tracks:
            return
        means = np.stack([t.mean for t in tracks])
        covs = np.stack([t.cov for t in tracks])
        still = np.array([t.state != TrackState.TRACKED for t in tracks])
        means[np.ix_(still, self.kalman.size_velocities)] = 0
        means, covs = self.kalman.predict(means, covs)
        for track, mean, cov in zip(tracks, means, covs):
            track.mean, track.cov = mean, cov

    def _compensate_camera(self, image: np.ndarray | None, *groups: list[Track]) -> None:
        """ByteTrack assumes a still camera."""

    def _apply(self, matches: list[tuple[int, int]], tracks: list[Track], detections: list[Track],
               activated: list[Track], refound: list[Track]) -> None:
        """Update each matched track with its detection: a tracked one goes on, a lost one is found again."""
        if not matches:
            return
        matched = [tracks[i] for i, _ in matches]
        dets = [detections[j] for _, j in matches]
        measured = self.kalman.measurement(np.stack([d.tlwh for d in dets]))
        means, covs = self.kalman.update(np.stack([t.mean for t in matched]), np.stack([t.cov for t in matched]),
                                         measured)
        for track, det, mean, cov in zip(matched, dets, means, covs):
            (activated if track.state == TrackState.TRACKED else refound).append(track)
            track.mean, track.cov = mean, cov
            track.take(det, self.frame)

    def _start(self, det: Track) -> None:
        self._last_id += 1
        det.track_id = self._last_id
        means, covs = self.kalman.initiate(self.kalman.measurement(det.tlwh[None]))
        det.mean, det.cov = means[0], covs[0]
        det.state = TrackState.TRACKED
        det.activated = self.frame == 1  # the first frame's tracks are shown at once; later ones when confirmed
        det.frame = det.start_frame = self.frame

    def _merge(self, activated: list[Track], refound: list[Track], lost: list[Track], removed: list[Track]) -> None:
        tracked = [t for t in self.tracked if t.state == TrackState.TRACKED]
        tracked = _union(_union(tracked, activated), refound)
        kept_lost = _minus(self.lost, tracked) + lost
        # Ids removed before this frame: this frame's removals leave the lost pool in the next one.
        kept_lost = _minus(kept_lost, self.removed_ids)
        self.tracked, self.lost = _drop_duplicates(tracked, kept_lost, self.kalman)
        self.removed_ids.extend(t.track_id for t in removed)

    def _output(self) -> Tracks:
        shown = [t for t in self.tracked if t.activated]
        boxes = self._boxes(shown) if shown else np.zeros((0, 4), dtype=np.float32)
        return Tracks(boxes, np.array([t.track_id for t in shown], dtype=np.int64),
                      np.array([t.score for t in shown], dtype=np.float32),
                      np.array([t.cls for t in shown], dtype=np.int64),
                      np.array([t.det_index for t in shown], dtype=np.int64))


class BotSort(ByteTracker):
    """ByteTrack with a width-height Kalman state and camera-motion compensation (ReID is not implemented)."""

    parametrisation = "xywh"

    def reset(self) -> None:
        super().reset()
        self.motion = SparseFlowMotion() if self.config.gmc_method == "sparseOptFlow" else None

    def _compensate_camera(self, image: np.ndarray | None, *groups: list[Track]) -> None:
        """Move every track's prediction with the camera motion since the last frame."""
        if self.motion is None or image is None:
            return
        warp = self.motion.apply(image)
        for tracks in groups:
            if tracks:
                means, covs = warp_states(np.stack([t.mean for t in tracks]), np.stack([t.cov for t in tracks]),
                                          warp)
                for track, mean, cov in zip(tracks, means, covs):
                    track.mean, track.cov = mean, cov


def make_tracker(config: TrackerConfig) -> ByteTracker:
    """The tracker ``config.tracker_type`` names."""
    return BotSort(config) if config.tracker_type == "botsort" else ByteTracker(config)


def _union(first: list[Track], second: list[Track]) -> list[Track]:
    """``first`` and then the tracks of ``second`` whose id is not in it."""
    ids = {t.track_id for t in first}
    return first + [t for t in second if t.track_id not in ids]


def _minus(tracks: list[Track], ids: list[Track] | deque[int]) -> list[Track]:
    """``tracks`` without those whose id is in ``ids`` (tracks or ids)."""
    drop = {t if isinstance(t, int) else t.track_id for t in ids}
    return [t for t in tracks if t.track_id not in drop]


def _drop_duplicates(tracked: list[Track], lost: list[Track], kalman: KalmanFilter) -> tuple[list[Track], list[Track]]:
    """A tracked and a lost track on the same object: the younger of the two goes (the tracked one on a tie)."""
    if not tracked or not lost:
        return tracked, lost
    boxes = [kalman.xyxy(np.stack([t.mean for t in group])).astype(np.float32) for group in (tracked, lost)]
    drop_tracked, drop_lost = set(), set()
    for i, j in zip(*np.nonzero(iou_cost(*boxes) < DUPLICATE_IOU_COST)):
        if tracked[i].frame - tracked[i].start_frame > lost[j].frame - lost[j].start_frame:
            drop_lost.add(j)
        else:
            drop_tracked.add(i)
    return ([t for i, t in enumerate(tracked) if i not in drop_tracked],
            [t for j, t in enumerate(lost) if j not in drop_lost])
