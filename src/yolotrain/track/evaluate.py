"""Tracks scored against MOTChallenge ground truth with TrackEval, the MOTChallenge's own scorer:
HOTA (detection and association accuracy together), the CLEAR MOT metrics (MOTA, MOTP, id switches)
and the identity metrics (IDF1).

Ground truth is a folder of sequences in MOTChallenge layout, ``GT/SEQUENCE/gt/gt.txt`` rows
``frame, id, x, y, w, h, considered, class, visibility``. Every object counts as a pedestrian, the one
class TrackEval's MOTChallenge reader knows: the scores are class-agnostic, as MOTChallenge's are.

Only the frames that were tracked are scored, on both sides: the ground truth of frames ``--vid-stride``
skipped is left out (each sequence's ``frames`` says how many were scored). The ground truth is checked
row by row before TrackEval reads a copy of it: a row that is not numbers is an error naming the file and
line; rows on frames below 1, past the end of the sequence, or with values that are not finite are left out
and named in one :class:`GroundTruthWarning` per file.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import tempfile
import warnings
from collections.abc import Collection, Mapping
from pathlib import Path

from ..messages import brief

# The reported numbers: TrackEval's field names, as shares (0..1) except the counts; then the frames scored.
SUMMARY_FIELDS = ("HOTA", "DetA", "AssA", "MOTA", "MOTP", "IDF1", "IDSW", "IDs")
# What TrackEval's MOTChallenge reader needs of a ground-truth row: frame, id, box, considered, class.
GT_COLUMNS = 8
GT_LAYOUT = "frame, id, x, y, w, h, considered, class, visibility"
# Line numbers shown per kind of left-out row.
SHOWN_LINES = 5


class TrackEvalError(ValueError):
    """Ground truth TrackEval cannot score (missing files, malformed rows)."""


class GroundTruthWarning(UserWarning):
    """Ground-truth rows left out of the scores (frames below 1 or past the end, values not finite)."""


def _fields(line: str) -> list[str]:
    """A MOTChallenge row's values: comma-separated (TrackEval also reads them space-separated)."""
    fields = re.split(r"\s*,\s*" if "," in line else r"\s+", line.strip())
    return fields[:-1] if len(fields) > 1 and not fields[-1] else fields  # a trailing comma, as TrackEval allows


def _lines(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:SHOWN_LINES]))
    return f"line{'s' if len(numbers) > 1 else ''} {shown}{' ...' if len(numbers) > SHOWN_LINES else ''}"


def read_ground_truth(path: Path, tracked: Collection[int]) -> list[str]:
    """The rows of ``path`` on the ``tracked`` frames, as TrackEval reads them (frames as whole numbers);
    rows on frames between the tracked ones (skipped by ``--vid-stride``) are left out silently.

    Rows on frames below 1, past the end of the sequence (the last tracked frame, or up to the next one
    ``--vid-stride`` would have tracked) or with values that are not finite are left out, named in one
    :class:`GroundTruthWarning`.

    Raises:
        TrackEvalError: a row that is not :data:`GT_COLUMNS` numbers or more, named by file and line.
    """
    frames = sorted(set(tracked))
    step = min((b - a for a, b in zip(frames, frames[1:])), default=1)
    end = frames[-1] + step - 1  # the video's last frame is at most this
    kept = []
    left_out: dict[str, list[int]] = {}
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        fields = _fields(line)
        if len(fields) < GT_COLUMNS:
            raise TrackEvalError(f"{path}, line {number}: {len(fields)} values, a MOTChallenge ground-truth row has "
                                 f"{GT_COLUMNS} or more ({GT_LAYOUT})")
        try:
            values = [float(f) for f in fields]
        except ValueError:
            bad = next(f for f in fields if not _is_number(f))
            raise TrackEvalError(f"{path}, line {number}: {brief(bad)} is not a number ({GT_LAYOUT})") from None
        frame = values[0]
        if not all(math.isfinite(v) for v in values):
            left_out.setdefault("with values that are not finite (NaN, inf)", []).append(number)
        elif frame != int(frame):
            raise TrackEvalError(f"{path}, line {number}: frame {fields[0]} is not a whole number ({GT_LAYOUT})")
        elif frame < 1:
            left_out.setdefault("on frames below 1 (MOTChallenge frames count from 1)", []).append(number)
        elif frame > end:
            left_out.setdefault(f"on frames past the end of the sequence (its last frame tracked is {frames[-1]})",
                                []).append(number)
        elif int(frame) in tracked:
            kept.append(",".join([str(int(frame)), *fields[1:]]))
    if left_out:
        total = sum(map(len, left_out.values()))
        parts = "; ".join(f"{len(lines)} {why} ({_lines(lines)})" for why, lines in left_out.items())
        warnings.warn(f"{path}: {total} ground-truth row(s) left out of the scores: {parts}", GroundTruthWarning,
                      stacklevel=3)
    return kept


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _tracked_rows(path: Path, tracked: Collection[int]) -> list[str]:
    """The rows of a tracks file on the ``tracked`` frames."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fields = _fields(line) if line.strip() else []
        try:
            frame = float(fields[0]) if fields else None
        except ValueError:
            raise TrackEvalError(f"{path}, line {number}: frame {brief(fields[0])} is not a number") from None
        if frame is not None and frame in tracked:
            rows.append(",".join([str(int(frame)), *fields[1:]]))
    return rows


def evaluate_tracks(gt_folder: str | os.PathLike, tracks_folder: str | os.PathLike,
                    frames_seen: Mapping[str, int | Collection[int]]) -> dict[str, dict[str, float]]:
    """HOTA, MOTA, IDF1 ... per sequence and ``COMBINED``, for the MOTChallenge files
    ``tracks_folder/SEQUENCE.txt`` of the sequences in ``frames_seen`` that ``gt_folder`` has ground truth
    for, and the number of ``frames`` scored.

    ``frames_seen`` maps each sequence to the frames tracked (MOTChallenge numbers, from 1), or to their
    number (frames 1 to N): only those frames are scored, of the ground truth and of the tracks. Rows of
    the ground truth on other frames are left out (see :func:`read_ground_truth`).

    Raises:
        TrackEvalError: no tracked sequence has ground truth, a ground-truth row is not numbers (named by
            file and line), or TrackEval cannot score it.
        ImportError: TrackEval is missing (``pip install 'yolotrain[track]'``).
    """
    try:
        import trackeval
    except ImportError:
        raise ImportError("--eval needs TrackEval: pip install 'yolotrain[track]'") from None
    gt, tracks = Path(gt_folder), Path(tracks_folder)
    if not gt.is_dir():
        raise FileNotFoundError(f"ground-truth folder not found: {gt}")
    tracked = {seq: set(range(1, n + 1)) if isinstance(n, int) else set(n) for seq, n in frames_seen.items()}
    scored = {seq: frames for seq, frames in tracked.items() if frames and (gt / seq / "gt" / "gt.txt").is_file()}
    if not scored:
        raise TrackEvalError(f"{gt} has no ground truth for the tracked sequence(s) {', '.join(frames_seen)} "
                             "(expected SEQUENCE/gt/gt.txt)")
    with tempfile.TemporaryDirectory(prefix="yolotrain-trackeval-") as temp:
        # TrackEval reads copies holding the tracked frames alone, checked row by row.
        copies = Path(temp)
        for seq, frames in scored.items():
            rows = read_ground_truth(gt / seq / "gt" / "gt.txt", frames)
            (copies / "gt" / seq / "gt").mkdir(parents=True)
            (copies / "gt" / seq / "gt" / "gt.txt").write_text("".join(f"{row}\n" for row in rows))
            (copies / "tracks" / "mot").mkdir(parents=True, exist_ok=True)
            track_file = tracks / f"{seq}.txt"
            track_rows = _tracked_rows(track_file, frames) if track_file.is_file() else []
            (copies / "tracks" / "mot" / f"{seq}.txt").write_text("".join(f"{row}\n" for row in track_rows))
        per_sequence = _run_trackeval(trackeval, copies / "gt", copies / "tracks" / "mot",
                                      {seq: max(frames) for seq, frames in scored.items()})
    summary = {seq: _summary(res["pedestrian"]) for seq, res in per_sequence.items()}
    for seq, values in summary.items():
        values["frames"] = float(len(scored[seq]) if seq in scored else sum(map(len, scored.values())))
    return summary


def _run_trackeval(trackeval, gt: Path, tracks: Path, lengths: dict[str, int]) -> dict:
    """TrackEval's results per sequence for the MOTChallenge files in ``gt`` and ``tracks``; its own output
    (progress, and the traceback it prints before re-raising an error) is kept off the console."""
    dataset_config = {
        "GT_FOLDER": str(gt), "TRACKERS_FOLDER": str(tracks.parent), "TRACKERS_TO_EVAL": [tracks.name],
        "TRACKER_SUB_FOLDER": "", "OUTPUT_FOLDER": str(tracks.parent), "SKIP_SPLIT_FOL": True,
        "SEQ_INFO": lengths, "PRINT_CONFIG": False,
    }
    eval_config = {"USE_PARALLEL": False, "PRINT_RESULTS": False, "PRINT_CONFIG": False, "TIME_PROGRESS": False,
                   "OUTPUT_SUMMARY": False, "OUTPUT_DETAILED": False, "PLOT_CURVES": False,
                   "BREAK_ON_ERROR": True, "LOG_ON_ERROR": None, "DISPLAY_LESS_PROGRESS": True}
    metrics = [trackeval.metrics.HOTA(), trackeval.metrics.CLEAR({"PRINT_CONFIG": False}),
               trackeval.metrics.Identity({"PRINT_CONFIG": False})]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            dataset = trackeval.datasets.MotChallenge2DBox(dataset_config)
            results, _ = trackeval.Evaluator(eval_config).evaluate([dataset], metrics)
        except trackeval.utils.TrackEvalException as error:
            raise TrackEvalError(f"TrackEval: {error}") from None
    return results["MotChallenge2DBox"][tracks.name]


def _summary(result: dict) -> dict[str, float]:
    values = {**result["HOTA"], **result["CLEAR"], **result["Identity"], **result["Count"]}
    out = {}
    for name in SUMMARY_FIELDS:
        value = values[name]
        out[name] = float(value.mean()) if hasattr(value, "mean") else float(value)  # HOTA: mean over IoU levels
    return out
