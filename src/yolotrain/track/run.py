"""``yolotrain track`` and :func:`track`: prediction (``predict(stream=True)``) with each sequence's
detections joined into tracks, saved as annotated videos, MOTChallenge files and JSON, and scored
against ground truth with ``--eval``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import warnings
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import torch

from ..detector import Detector
from ..devices import select_device
from ..eval.inference import ModelOrWeights, one_weights
from ..interop.loading.resolve import resolve_model, weights_inputs
from ..outputs import refuse_overwriting_inputs
from ..prediction.run import (
    PredictConfig,
    Result,
    Source,
    SourceWarning,
    add_predict_arguments,
    check_display,
    expand_sources,
    expected_frames,
    precision_announcement,
    predict,
    predict_config,
    progress_hooks,
)
from ..prediction.streams import frame_rate, is_stream
from ..progress import progress_bar
from ..runs import next_run_dir, run_lock
from ..settings import add_arguments, flat_names, flat_values, from_flat, setting
from ..task import task_of
from .config import TrackerConfig, tracker_config
from .evaluate import GroundTruthWarning, evaluate_tracks
from .outputs import MOT_FOLDER, SequenceOutputs
from .result import TrackResult
from .trackers import ByteTracker, make_tracker

DEFAULT_PROJECT = "runs/track"
# Detections kept for tracking: down to track_low_thresh, as ByteTrack's second round matches the weak
# ones (mostly occluded objects) to tracks left over; ultralytics' track mode uses the same.
TRACK_CONF = 0.1


@dataclass(frozen=True)
class TrackConfig:
    """``yolotrain track``'s own settings; the prediction settings are :class:`PredictConfig`'s."""

    tracker: str = setting("bytetrack", "bytetrack, botsort, or a tracker YAML (tracker_type and the settings "
                           "to change; ultralytics' tracker files read unchanged)")
    trail: int = setting(30, "frames of each track's path drawn behind its box (0: none)", min=0)
    eval: str | None = setting(None, "score the tracks against MOTChallenge ground truth in this folder "
                               "(SEQUENCE/gt/gt.txt, SEQUENCE named as the video, stream or frame folder): "
                               "HOTA, MOTA, IDF1 with TrackEval, saved to metrics.json")


def sequence_of(result: Result) -> str:
    """Which sequence a result belongs to: its video or stream, or the folder of its image."""
    return result.path if result.frame is not None else str(Path(result.path).parent)


def sequence_name(key: str, result: Result, position: int) -> str:
    """File stem of a sequence: a video's stem, ``cameraN``/``streamN`` for live sources, a frame folder's
    name (its parent's for a MOTChallenge ``img1`` folder), ``images`` for in-memory images."""
    if result.frame is not None:
        if is_stream(key):
            return f"camera{key}" if key.isdigit() else f"stream{position}"
        return Path(key).stem
    if key in ("", "."):  # in-memory images
        return "images"
    folder = Path(key).resolve()
    return (folder.parent.name if folder.name == "img1" else folder.name) or "images"


def track(
    model_or_weights: ModelOrWeights,
    source: Source | Sequence[Source],
    tracker: str | os.PathLike | TrackerConfig = TrackConfig.tracker,
    save_dir: str | os.PathLike | None = None,
    trail: int = TrackConfig.trail,
    stream: bool = False,
    save: bool = PredictConfig.save,
    save_txt: bool = PredictConfig.save_txt,
    save_crop: bool = PredictConfig.save_crop,
    view_img: bool = PredictConfig.view_img,
    hide_labels: bool = PredictConfig.hide_labels,
    hide_conf: bool = PredictConfig.hide_conf,
    line_width: int | None = PredictConfig.line_width,
    **predict_settings,
) -> list[TrackResult] | Iterator[TrackResult]:
    """Detect objects and follow them through videos, streams and folders of frames.

    Each video, camera, stream, and each folder of images (its frames, in name order) is one sequence,
    tracked from a fresh tracker with ids from 1.

    Args:
        model_or_weights, source: as :func:`~yolotrain.prediction.predict`.
        tracker: ``bytetrack``, ``botsort`` (the published settings), a tracker YAML, or a
            :class:`~yolotrain.track.TrackerConfig`.
        save_dir: where each sequence's files go: ``mot/SEQUENCE.txt`` (MOTChallenge rows, always),
            ``SEQUENCE.json`` (every frame's tracks), the annotated ``SEQUENCE.mp4`` (folders of frames:
            ``SEQUENCE/`` images) with ``save``, ``labels/SEQUENCE_FRAME.txt`` (YOLO rows ending with score
            and id) with ``save_txt``, ``crops/SEQUENCE/ID/FRAME.jpg`` with ``save_crop``.
        trail: frames of each track's path drawn behind its box.
        stream: return an iterator of results (one frame at a time) instead of the list.
        save, save_txt, save_crop, view_img, hide_labels, hide_conf, line_width: as :func:`predict`'s.
        predict_settings: the other keywords of :func:`~yolotrain.prediction.predict` (``img_size``,
            ``conf``, ``device``, ``vid_stride`` ...); ``conf`` defaults to :data:`TRACK_CONF`, 0.1, so that
            the weak detections of ByteTrack's second round reach the tracker.

    Returns:
        One :class:`TrackResult` per image and frame (with ``stream``, an iterator). Ctrl-C on a camera
        or stream ends it there, with everything tracked so far saved.
    """
    config = tracker_config(tracker)
    if trail < 0:
        raise ValueError(f"trail must be at least 0 frames, got {trail}")
    if view_img:
        check_display()
    out = Path(save_dir) if save_dir is not None else None
    if out is not None and isinstance(source, (str, os.PathLike, list, tuple)):
        items = expand_sources(source)
        weights = weights_inputs(model_or_weights) if isinstance(model_or_weights, (str, os.PathLike)) else []
        refuse_overwriting_inputs([("--project/--name", out)],
                                  weights + [("source", item) for item in items if isinstance(item, Path)])
    model = _detector(model_or_weights, predict_settings)
    predict_settings.setdefault("conf", TRACK_CONF)
    results = predict(model, source, stream=True, save_dir=None, view_img=False,
                      line_width=line_width, **predict_settings)
    # The run folder's lock, held until the tracks are all written (one writer per run folder).
    held = contextlib.ExitStack()
    try:
        held.enter_context(run_lock(out))
    except BaseException:
        results.close()
        raise
    options = {"save_media": save, "save_txt": save_txt, "save_crop": save_crop, "view": view_img, "trail": trail,
               "draw_options": {"line_width": line_width, "hide_labels": hide_labels, "hide_conf": hide_conf}}
    tracked = _track_all(results, config, out, options, held)
    weakref.finalize(tracked, held.close)  # a stream dropped before its first step
    return tracked if stream else list(tracked)


def _detector(model_or_weights: ModelOrWeights, predict_settings: dict) -> Detector:
    """The model to track with, loaded once here (predict uses it as loaded); a classifier, which has no
    boxes to track, is refused in one line before any source is read. A file's model runs where a file's
    would (the best device), not where a model given in memory is left."""
    model = resolve_model(model_or_weights, trust_code=predict_settings.get("trust_code", PredictConfig.trust_code))
    what = model_or_weights if isinstance(model_or_weights, (str, os.PathLike)) else type(model).__name__
    if (refusal := task_of(model).track_refusal(what)) is not None:
        raise ValueError(refusal)
    if model is not model_or_weights and predict_settings.get("device") is None:
        predict_settings["device"] = select_device(None)
    return model


def _track_all(results: Iterator[Result], config: TrackerConfig, save_dir: Path | None,
               options: dict, held: contextlib.ExitStack) -> Iterator[TrackResult]:
    """Each result with its tracks; a new sequence resets the tracker. The outputs are closed and the run
    folder's lock (in ``held``) released however the iteration ends; Ctrl-C during a live sequence ends it
    quietly (as :func:`predict` does)."""
    tracker = make_tracker(config)
    current: str | None = None
    outputs: SequenceOutputs | None = None
    live = False
    names: set[str] = set()
    try:
        for result in results:
            key = sequence_of(result)
            if key != current:
                if outputs is not None:
                    outputs.close()
                current, live = key, result.frame is not None and is_stream(key)
                name = _unique(sequence_name(key, result, len(names)), names)
                tracker.reset()
                outputs = SequenceOutputs(save_dir, name, video=result.frame is not None, fps=_fps(key, live),
                                          **options)
            tracked = _tracked(tracker, result, outputs.name, outputs.frame_count + 1)
            outputs.add(tracked, result.image)
            yield tracked
    except KeyboardInterrupt:
        if not live:
            raise
    finally:
        results.close()
        if outputs is not None:
            outputs.close()
        held.close()


def _tracked(tracker: ByteTracker, result: Result, sequence: str, position: int) -> TrackResult:
    tracks = tracker.update(result.boxes.numpy(), result.scores.numpy(), result.classes.numpy(), result.image)
    index = torch.from_numpy(tracks.det_index)
    mot_frame = result.frame + 1 if result.frame is not None else position
    return TrackResult(result.path, torch.from_numpy(tracks.boxes), result.scores[index], result.classes[index],
                       result.names, result.orig_shape, result.frame, ids=torch.from_numpy(tracks.ids),
                       keypoints=None if result.keypoints is None else result.keypoints[tracks.det_index],
                       sequence=sequence, mot_frame=mot_frame)


def _fps(key: str, live: bool) -> float:
    """Frame rate of the annotated video: the source's (30 for streams and frame folders)."""
    if live or not Path(key).is_file():
        return 30.0
    cap = cv2.VideoCapture(key)
    try:
        return frame_rate(cap)
    finally:
        cap.release()


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name2``, ``name3`` ... when an earlier sequence of the run has it."""
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}{n}", n + 1
    taken.add(candidate)
    return candidate


# The settings track() takes as keywords: predict's, less the run folder and what track handles itself.
_RUN_ONLY = ("weights", "source", "project", "name", "exist_ok")


def add_track_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``yolotrain track`` options: :class:`PredictConfig`'s (run folder under ``runs/track``, detections
    down to :data:`TRACK_CONF`) and :class:`TrackConfig`'s."""
    add_predict_arguments(parser)
    for action in parser._actions:
        if action.dest == "project":
            action.help = f"parent of the run folder (default {DEFAULT_PROJECT})"
        elif action.dest == "conf":
            action.help = f"confidence threshold (default {TRACK_CONF}: the tracker's second round needs weak boxes)"
    add_arguments(parser, TrackConfig)
    return parser


def run_track(args: argparse.Namespace) -> int:
    """Run ``yolotrain track`` from parsed arguments; returns the process exit code."""
    names = flat_names(TrackConfig)
    track_settings = from_flat(TrackConfig, {k: v for k, v in vars(args).items() if k in names})
    predict_args = argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in names})
    if "project" not in predict_args:
        predict_args.project = DEFAULT_PROJECT
    config = predict_config(predict_args)
    tracker = tracker_config(track_settings.tracker)
    if track_settings.eval is not None and not Path(track_settings.eval).is_dir():
        raise FileNotFoundError(f"ground-truth folder not found: {track_settings.eval}")
    weights = one_weights(config.weights)
    save_dir = next_run_dir(config.project, config.name, config.exist_ok)
    keywords = {k: v for k, v in flat_values(config).items() if k not in _RUN_ONLY}
    if "conf" not in vars(args):
        del keywords["conf"]  # track()'s own default
    frames: dict[str, set[int]] = {}  # the frames tracked of each sequence, which --eval scores
    count = 0
    total = expected_frames(list(config.source), config.vid_stride)
    with warnings.catch_warnings(record=True) as caught, progress_bar(total=total, desc="track", unit="img") as bar:
        warnings.simplefilter("always", SourceWarning)
        hooks = progress_hooks(bar, getattr(args, "verbose", False)) | (precision_announcement(config.half) or {})
        for result in track(weights, list(config.source), tracker, save_dir=save_dir, trail=track_settings.trail,
                            stream=True, callbacks=hooks, **keywords):
            frames.setdefault(result.sequence, set()).add(result.mot_frame)
            count += 1
    for w in caught:
        print(f"warning: {w.message}")
    print(f"{count} images/frames in {len(frames)} sequence(s), {tracker.tracker_type}. Results saved to {save_dir}")
    if track_settings.eval is not None and frames:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", GroundTruthWarning)
            scores = evaluate_tracks(track_settings.eval, save_dir / MOT_FOLDER, frames)
        for w in caught:
            print(f"warning: {w.message}")
        (save_dir / "metrics.json").write_text(json.dumps(scores, indent=2))
        if config.vid_stride > 1:
            print(f"scored on the frames tracked alone (--vid-stride {config.vid_stride}: one frame in "
                  f"{config.vid_stride}); the ground truth of the frames between is left out")
        print(format_scores(scores))
    return 0 if count else 1


def format_scores(scores: dict[str, dict[str, float]]) -> str:
    """A table of HOTA, MOTA, IDF1 ... per sequence, in percent (counts, and the frames scored, as they are)."""
    fields = next(iter(scores.values())).keys()
    lines = [f"{'sequence':<16}" + "".join(f"{f:>8}" for f in fields)]
    for seq, values in scores.items():
        cells = [f"{v:8.0f}" if f in ("IDSW", "IDs", "frames") else f"{100 * v:8.1f}" for f, v in values.items()]
        lines.append(f"{'all' if seq == 'COMBINED_SEQ' else seq:<16}" + "".join(cells))
    return "\n".join(lines)


__all__ = ["TrackConfig", "TrackResult", "track"]
