"""Tracks scored against MOTChallenge ground truth with TrackEval, the MOTChallenge's own scorer:
HOTA (detection and association accuracy together), the CLEAR MOT metrics (MOTA, MOTP, id switches)
and the identity metrics (IDF1).

Ground truth is a folder of sequences in MOTChallenge layout, ``GT/SEQUENCE/gt/gt.txt`` rows
``frame, id, x, y, w, h, considered, class, visibility`` (+ ``seqinfo.ini`` with ``seqLength``). Every
object counts as a pedestrian, the one class TrackEval's MOTChallenge reader knows: the scores are
class-agnostic, as MOTChallenge's are.
"""

from __future__ import annotations

import configparser
import contextlib
import io
import os
from pathlib import Path

# The reported numbers: TrackEval's field names, as shares (0..1) except the counts.
SUMMARY_FIELDS = ("HOTA", "DetA", "AssA", "MOTA", "MOTP", "IDF1", "IDSW", "IDs")


class TrackEvalError(ValueError):
    """Ground truth TrackEval cannot score (missing files, malformed rows)."""


def sequence_length(gt_folder: Path, sequence: str, frames_seen: int) -> int:
    """Frames of a sequence: ``seqinfo.ini``'s ``seqLength``, else the last frame of the ground truth or of
    the tracks, whichever is later."""
    ini = gt_folder / sequence / "seqinfo.ini"
    if ini.is_file():
        parser = configparser.ConfigParser()
        parser.read(ini)
        if parser.has_option("Sequence", "seqLength"):
            return int(parser["Sequence"]["seqLength"])
    rows = (gt_folder / sequence / "gt" / "gt.txt").read_text().split()
    return max([frames_seen, *(int(float(row.split(",")[0])) for row in rows)])


def evaluate_tracks(gt_folder: str | os.PathLike, tracks_folder: str | os.PathLike,
                    frames_seen: dict[str, int]) -> dict[str, dict[str, float]]:
    """HOTA, MOTA, IDF1 ... per sequence and ``COMBINED``, for the MOTChallenge files
    ``tracks_folder/SEQUENCE.txt`` of the sequences in ``frames_seen`` (name → frames tracked) that
    ``gt_folder`` has ground truth for.

    Raises:
        TrackEvalError: no tracked sequence has ground truth, or TrackEval cannot read it.
        ImportError: TrackEval is missing (``pip install 'yolotrain[track]'``).
    """
    try:
        import trackeval
    except ImportError:
        raise ImportError("--eval needs TrackEval: pip install 'yolotrain[track]'") from None
    gt, tracks = Path(gt_folder), Path(tracks_folder)
    if not gt.is_dir():
        raise FileNotFoundError(f"ground-truth folder not found: {gt}")
    scored = {seq: n for seq, n in frames_seen.items() if (gt / seq / "gt" / "gt.txt").is_file()}
    if not scored:
        raise TrackEvalError(f"{gt} has no ground truth for the tracked sequence(s) {', '.join(frames_seen)} "
                             "(expected SEQUENCE/gt/gt.txt)")
    dataset_config = {
        "GT_FOLDER": str(gt), "TRACKERS_FOLDER": str(tracks.parent), "TRACKERS_TO_EVAL": [tracks.name],
        "TRACKER_SUB_FOLDER": "", "OUTPUT_FOLDER": str(tracks.parent), "SKIP_SPLIT_FOL": True,
        "SEQ_INFO": {seq: sequence_length(gt, seq, n) for seq, n in scored.items()}, "PRINT_CONFIG": False,
    }
    eval_config = {"USE_PARALLEL": False, "PRINT_RESULTS": False, "PRINT_CONFIG": False, "TIME_PROGRESS": False,
                   "OUTPUT_SUMMARY": False, "OUTPUT_DETAILED": False, "PLOT_CURVES": False,
                   "BREAK_ON_ERROR": True, "LOG_ON_ERROR": None, "DISPLAY_LESS_PROGRESS": True}
    metrics = [trackeval.metrics.HOTA(), trackeval.metrics.CLEAR({"PRINT_CONFIG": False}),
               trackeval.metrics.Identity({"PRINT_CONFIG": False})]
    with contextlib.redirect_stdout(io.StringIO()):  # TrackEval prints its progress
        try:
            dataset = trackeval.datasets.MotChallenge2DBox(dataset_config)
            results, _ = trackeval.Evaluator(eval_config).evaluate([dataset], metrics)
        except trackeval.utils.TrackEvalException as error:
            raise TrackEvalError(f"TrackEval: {error}") from None
    per_sequence = results["MotChallenge2DBox"][tracks.name]
    return {seq: _summary(res["pedestrian"]) for seq, res in per_sequence.items()}


def _summary(result: dict) -> dict[str, float]:
    values = {**result["HOTA"], **result["CLEAR"], **result["Identity"], **result["Count"]}
    out = {}
    for name in SUMMARY_FIELDS:
        value = values[name]
        out[name] = float(value.mean()) if hasattr(value, "mean") else float(value)  # HOTA: mean over IoU levels
    return out
