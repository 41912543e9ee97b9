"""``yolotrain track`` on faulty inputs: ground truth with rows outside the sequence, not finite or not numbers,
frames skipped by ``--vid-stride``, and classifier weights."""

import json
from pathlib import Path

import pytest

from yolotrain.checkpoint import save_checkpoint
from yolotrain.cli import main
from yolotrain.data.shapes_video import generate_shapes_video
from yolotrain.model.classify import Classifier
from yolotrain.track.evaluate import GroundTruthWarning, TrackEvalError, evaluate_tracks
from yolotrain.track.run import track

FRAMES = 6
QUICK = ["--img", "64", "--conf", "0.001", "--max-det", "6", "--device", "cpu", "--nosave"]


@pytest.fixture
def clip(tmp_path) -> Path:
    """A 6-frame moving-shapes video and its ground truth, in a folder of this test's own."""
    return generate_shapes_video(tmp_path / "data", frames=FRAMES)


def gt_file(clip: Path) -> Path:
    return clip / "shapes" / "gt" / "gt.txt"


def perfect_tracks(rows: list[str], folder: Path, frames: set[int] | None = None) -> Path:
    """Tracks equal to the ground truth ``rows`` (on ``frames`` alone when given): the MOT folder."""
    folder.mkdir(parents=True)
    kept = [r for r in rows if frames is None or int(r.split(",")[0]) in frames]
    (folder / "shapes.txt").write_text("".join(f"{','.join(r.split(',')[:6])},1,-1,-1,-1\n" for r in kept))
    return folder


def test_rows_outside_the_sequence_or_not_finite_are_left_out_and_named(clip, tmp_path):
    """Before: TrackEval's own traceback for frame -5, and rows past the end scored as misses."""
    rows = gt_file(clip).read_text().splitlines()
    tracks = perfect_tracks(rows, tmp_path / "perfect")
    n = len(rows)
    gt_file(clip).write_text("\n".join([*rows, "-5,1,10,10,5,5,1,1,1", f"{FRAMES + 3},1,10,10,5,5,1,1,1",
                                        "3,2,nan,10,5,5,1,1,1", "4,2,10,10,inf,5,1,1,1"]) + "\n")
    with pytest.warns(GroundTruthWarning) as caught:
        scores = evaluate_tracks(clip, tracks, {"shapes": FRAMES})["shapes"]
    assert scores["HOTA"] == scores["MOTA"] == scores["IDF1"] == 1.0 and scores["frames"] == FRAMES
    (message,) = [str(w.message) for w in caught]
    assert message == (f"{gt_file(clip)}: 4 ground-truth row(s) left out of the scores: "
                       f"1 on frames below 1 (MOTChallenge frames count from 1) (line {n + 1}); "
                       f"1 on frames past the end of the sequence (its last frame tracked is {FRAMES}) "
                       f"(line {n + 2}); 2 with values that are not finite (NaN, inf) (lines {n + 3}, {n + 4})")


def test_only_the_frames_tracked_are_scored(clip, tmp_path):
    """Every second frame tracked: the ground truth of the others is not counted as missed."""
    rows = gt_file(clip).read_text().splitlines()
    odd = {1, 3, 5}
    scores = evaluate_tracks(clip, perfect_tracks(rows, tmp_path / "odd", odd), {"shapes": odd})
    assert scores["shapes"]["MOTA"] == scores["shapes"]["HOTA"] == 1.0 and scores["shapes"]["frames"] == 3
    assert scores["COMBINED_SEQ"]["frames"] == 3


@pytest.mark.parametrize("row, message", [
    ("frame,id,x,y,w,h,considered,class,visibility", "line 1: 'frame' is not a number (frame, id, x, y, w, h, "),
    ("1 car 10 10 5 5 1 1 1", "line 1: 'car' is not a number"),
    ("1,1,10,10,5,5", "line 1: 6 values, a MOTChallenge ground-truth row has 8 or more"),
    ("2.5,1,10,10,5,5,1,1,1", "line 1: frame 2.5 is not a whole number"),
])
def test_ground_truth_that_is_not_numbers_is_one_line_naming_file_and_line(clip, tmp_path, row, message):
    """Before: ``could not convert string to float`` from TrackEval, naming neither file nor row."""
    gt_file(clip).write_text(row + "\n" + gt_file(clip).read_text())
    with pytest.raises(TrackEvalError) as raised:
        evaluate_tracks(clip, perfect_tracks([], tmp_path / "none"), {"shapes": FRAMES})
    assert str(raised.value).startswith(f"{gt_file(clip)}, {message}") and "\n" not in str(raised.value)


def test_cli_eval_names_bad_rows_and_scores_the_strided_frames(clip, tiny_weights, tmp_path, capsys):
    with gt_file(clip).open("a") as gt:
        gt.write(f"{FRAMES + 1},1,10,10,5,5,1,1,1\n")  # past the video's end (seqinfo.ini says 6 frames)
    code = main(["track", "--weights", str(tiny_weights), "--source", str(clip / "shapes.mp4"), *QUICK,
                 "--vid-stride", "2", "--eval", str(clip), "--project", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"warning: {gt_file(clip)}: 1 ground-truth row(s) left out of the scores: 1 on frames past the end" in out
    assert "scored on the frames tracked alone (--vid-stride 2: one frame in 2)" in out
    metrics = json.loads((tmp_path / "runs" / "exp" / "metrics.json").read_text())
    assert metrics["shapes"]["frames"] == 3


def test_cli_eval_on_text_ground_truth_is_one_line(clip, tiny_weights, tmp_path, capsys):
    gt_file(clip).write_text("frame,id,x,y,w,h,considered,class,visibility\n" + gt_file(clip).read_text())
    code = main(["track", "--weights", str(tiny_weights), "--source", str(clip / "shapes.mp4"), *QUICK,
                 "--eval", str(clip), "--project", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err == [f"yolotrain track: error: {gt_file(clip)}, line 1: 'frame' is not a number (frame, "
                                 "id, x, y, w, h, considered, class, visibility)"]


def test_tracking_with_a_classifier_is_one_line_before_any_work(clip, tmp_path, capsys):
    """Before: ``'ClassifyResult' object has no attribute 'boxes'`` once the first frame was classified."""
    classifier = Classifier.from_name("yolov5n-cls", 2, ["circle", "rectangle"]).eval()
    weights = save_checkpoint(tmp_path / "cls", classifier)
    code = main(["track", "--weights", str(weights), "--source", str(clip / "shapes.mp4"), "--device", "cpu",
                 "--project", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err == [f"yolotrain track: error: track follows detected boxes from frame to frame: "
                                 f"{weights} is a classifier, which has no boxes to track; give detection or "
                                 "segmentation weights"]
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ValueError, match=r"Classifier is a classifier, which has no boxes to track"):
        track(classifier, clip / "shapes.mp4", stream=True, device="cpu")
