"""Tracking: ByteTrack and BoT-SORT against ultralytics 8's trackers (the oracle) on a recorded detection
sequence, the tracker settings, the saved outputs, TrackEval scoring and a live stream stopped with Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
import yaml
from conftest import offline_ultralytics
from hypothesis import given, settings
from hypothesis import strategies as st

from yolotrain.cli import main
from yolotrain.data.shapes_video import generate_shapes_video, render
from yolotrain.prediction import predict
from yolotrain.settings import ConfigError
from yolotrain.track import TrackerConfig, make_tracker, tracker_config
from yolotrain.track.evaluate import evaluate_tracks
from yolotrain.track.gmc import SparseFlowMotion
from yolotrain.track.run import track

FIXTURE = Path(__file__).parent / "fixtures" / "track" / "detections.json"
# A random-init model scores every anchor at ~0.007: this threshold gives a handful of detections.
LOW_CONF = dict(conf=0.001, max_det=6, img_size=64, device="cpu")
# Tracker thresholds under those scores (and IoU not weighed by them), so the random model's boxes become tracks.
LOW_TRACKER = TrackerConfig(tracker_type="botsort", track_high_thresh=0.005, track_low_thresh=0.001,
                            new_track_thresh=0.005, fuse_score=False)


def low_tracker_yaml(folder: Path) -> str:
    path = folder / "low.yaml"
    path.write_text(yaml.safe_dump(vars(LOW_TRACKER)))
    return str(path)


@pytest.fixture(scope="module")
def ultralytics_trackers(tmp_path_factory):
    """ultralytics' BYTETracker and BOTSORT, offline, its settings file in a temporary folder."""
    with offline_ultralytics(tmp_path_factory):
        from ultralytics.engine.results import Boxes
        from ultralytics.trackers.bot_sort import BOTSORT
        from ultralytics.trackers.byte_tracker import BYTETracker
        from ultralytics.trackers.utils.gmc import GMC

        yield SimpleNamespace(bytetrack=BYTETracker, botsort=BOTSORT, Boxes=Boxes, GMC=GMC)


def recorded_sequence() -> list[np.ndarray]:
    """The oracle's detections, ``[n, 6]`` x1, y1, x2, y2, score, class per frame (see synthesise.py)."""
    return [np.array(f, np.float32).reshape(-1, 6) for f in json.loads(FIXTURE.read_text())["frames"]]


def panning_frames(n: int, size: tuple[int, int] = (256, 320)) -> list[np.ndarray]:
    """A textured scene seen by a camera panning right and down: what BoT-SORT's motion compensation follows."""
    rng = np.random.default_rng(0)
    texture = cv2.GaussianBlur(rng.integers(0, 255, (size[0] + 60, size[1] + 120, 3)).astype(np.uint8), (5, 5), 1.5)
    return [cv2.warpAffine(texture, np.float32([[1, 0, -0.5 * f], [0, 1, -0.2 * f]]), size[::-1]) for f in range(n)]


# The oracle


@pytest.mark.parametrize("name", ["bytetrack", "botsort"])
def test_ids_boxes_and_matches_equal_ultralytics_frame_by_frame(ultralytics_trackers, name):
    config = tracker_config(name)
    ours = make_tracker(config)
    theirs = getattr(ultralytics_trackers, name)(SimpleNamespace(**vars(config), model="auto"))
    sequence = recorded_sequence()
    seen: dict[int, list[int]] = {}
    for frame, (dets, image) in enumerate(zip(sequence, panning_frames(len(sequence))), start=1):
        expected = theirs.update(ultralytics_trackers.Boxes(dets, image.shape[:2]), image)
        got = ours.update(dets[:, :4], dets[:, 4], dets[:, 5], image)
        expected = expected.reshape(-1, 8)
        assert got.ids.tolist() == expected[:, 4].astype(int).tolist(), f"frame {frame}"
        assert got.det_index.tolist() == expected[:, 7].astype(int).tolist(), f"frame {frame}"
        np.testing.assert_allclose(got.boxes, expected[:, :4], atol=1e-3, err_msg=f"frame {frame}")
        np.testing.assert_array_equal(got.scores, expected[:, 5])
        for track_id in got.ids.tolist():
            seen.setdefault(track_id, []).append(frame)
    # The sequence exercises what matters: tracks lost and found again under their id, and new tracks
    # (clutter among them) started, confirmed or dropped unconfirmed all along (ids are numbered as started).
    refound = [i for i, frames in seen.items() if np.diff(frames).max(initial=1) > 1]
    assert len(refound) >= 3 and len(seen) >= 5 and max(seen) >= 15


@st.composite
def detection_sequences(draw) -> list[np.ndarray]:
    """A few objects drifting with noise, sometimes missed or weak, over up to 15 frames."""
    n_objects = draw(st.integers(1, 5))
    starts = draw(st.lists(st.tuples(st.floats(0, 200), st.floats(0, 200), st.floats(8, 60), st.floats(8, 60)),
                           min_size=n_objects, max_size=n_objects))
    speeds = draw(st.lists(st.tuples(st.floats(-8, 8), st.floats(-8, 8)), min_size=n_objects, max_size=n_objects))
    frames = []
    for f in range(draw(st.integers(2, 15))):
        rows = []
        for (x, y, w, h), (vx, vy) in zip(starts, speeds):
            if draw(st.booleans()) and draw(st.booleans()):  # missed a quarter of the time
                continue
            score = draw(st.sampled_from([0.05, 0.15, 0.3, 0.6, 0.9]))
            rows.append([x + vx * f, y + vy * f, x + vx * f + w, y + vy * f + h, score, 0])
        frames.append(np.array(rows, np.float32).reshape(-1, 6))
    return frames


@settings(max_examples=40, deadline=None)
@given(sequence=detection_sequences(), name=st.sampled_from(["bytetrack", "botsort"]))
def test_generated_sequences_get_ultralytics_ids(ultralytics_trackers, sequence, name):
    config = TrackerConfig(tracker_type=name, track_buffer=3)  # a short buffer: tracks dropped within the sequence
    ours = make_tracker(config)
    theirs = getattr(ultralytics_trackers, name)(SimpleNamespace(**vars(config), model="auto"))
    for dets in sequence:  # no image: BoT-SORT without camera motion
        expected = theirs.update(ultralytics_trackers.Boxes(dets, (256, 320)), None).reshape(-1, 8)
        got = ours.update(dets[:, :4], dets[:, 4], dets[:, 5])
        assert got.ids.tolist() == expected[:, 4].astype(int).tolist()
        assert got.det_index.tolist() == expected[:, 7].astype(int).tolist()


def test_camera_motion_equals_ultralytics_sparse_flow(ultralytics_trackers):
    ours, theirs = SparseFlowMotion(), ultralytics_trackers.GMC("sparseOptFlow")
    warps = []
    for image in panning_frames(6):
        warps.append(ours.apply(image))
        np.testing.assert_allclose(warps[-1], theirs.apply(image), atol=1e-9)
    np.testing.assert_allclose(warps[-1][:, 2], [-0.5, -0.2], atol=0.1)  # the pan, found


def test_gmc_none_and_bytetrack_ignore_the_camera():
    dets = recorded_sequence()[:20]
    frames = panning_frames(20)
    plain = make_tracker(TrackerConfig(tracker_type="botsort", gmc_method="none"))
    blind = make_tracker(TrackerConfig(tracker_type="botsort", gmc_method="none"))
    compensated = make_tracker(TrackerConfig(tracker_type="botsort"))
    differs = False
    for d, image in zip(dets, frames):
        a = plain.update(d[:, :4], d[:, 4], d[:, 5], image)
        b = blind.update(d[:, :4], d[:, 4], d[:, 5])
        c = compensated.update(d[:, :4], d[:, 4], d[:, 5], image)
        np.testing.assert_array_equal(a.boxes, b.boxes)
        differs |= a.boxes.shape == c.boxes.shape and not np.allclose(a.boxes, c.boxes)
    assert differs


# Settings


def test_tracker_names_yaml_files_and_ultralytics_files(tmp_path):
    assert tracker_config("botsort") == TrackerConfig(tracker_type="botsort")
    assert TrackerConfig().track_buffer == 30 and TrackerConfig().match_thresh == 0.8
    mine = tmp_path / "mine.yaml"
    mine.write_text("tracker_type: botsort\ntrack_buffer: 60\ngmc_method: none\n")
    assert tracker_config(mine) == TrackerConfig(tracker_type="botsort", track_buffer=60, gmc_method="none")
    import ultralytics  # every published file reads unchanged (ultralytics' own copies)

    published = Path(ultralytics.__file__).parent / "cfg" / "trackers"
    for name in ("bytetrack", "botsort"):
        values = yaml.safe_load((published / f"{name}.yaml").read_text())
        config = tracker_config(published / f"{name}.yaml")
        assert config == TrackerConfig(tracker_type=name)  # our defaults are the published ones
        assert {k: v for k, v in values.items() if k != "model"} == {k: getattr(config, k) for k in values
                                                                      if k != "model"}


@pytest.mark.parametrize("text, message", [
    ("tracker_type: botsort\nwith_reid: true\n", "with_reid: re-identification features are not implemented"),
    ("tracker_type: botsort\ngmc_method: orb\n", "gmc_method: expected one of 'sparseOptFlow', 'none'"),
    ("track_buffer: 10\n", "a tracker YAML needs tracker_type"),
    ("tracker_type: bytetrack\ntrack_bufer: 10\n", "did you mean 'track_buffer'"),
    ("tracker_type: bytetrack\ntrack_low_thresh: 0.5\n", "track_low_thresh (0.5) must not exceed"),
])
def test_bad_tracker_files_get_one_line(tmp_path, tiny_weights, capsys, text, message):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        tracker_config(path)
    assert message in str(error.value)
    code = main(["track", "--weights", str(tiny_weights), "--source", str(tmp_path), "--tracker", str(path),
                 "--project", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and message in err[0] and err[0].startswith("yolotrain track: error:")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("tracker, message", [
    ("sort", "--tracker sort: expected bytetrack, botsort or a tracker YAML file"),
    ("missing.yaml", "tracker file not found: missing.yaml"),
])
def test_unknown_tracker_is_one_line(tiny_weights, tmp_path, capsys, tracker, message):
    code = main(["track", "--weights", str(tiny_weights), "--source", str(tmp_path), "--tracker", tracker,
                 "--project", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err == [f"yolotrain track: error: {message}"]


# Outputs


def shapes_clip(root: Path, frames: int = 6) -> Path:
    """A short moving-shapes video with its ground truth: the folder."""
    return generate_shapes_video(root, frames=frames)


def test_track_saves_mot_json_video_labels_and_crops(tiny_weights, tmp_path):
    clip = shapes_clip(tmp_path / "data")
    out = tmp_path / "run"
    results = track(tiny_weights, clip / "shapes.mp4", LOW_TRACKER, save_dir=out, save_txt=True, save_crop=True,
                    **LOW_CONF)
    assert len(results) == 6 and sum(len(r.ids) for r in results) > 0
    mot = [line.split(",") for line in (out / "mot" / "shapes.txt").read_text().splitlines()]
    saved = json.loads((out / "shapes.json").read_text())["frames"]
    assert len(saved) == 6 and len(mot) == sum(len(f["tracks"]) for f in saved)
    for r, frame in zip(results, saved):
        assert r.ids.dtype == torch.long and len(r.ids) == len(r.boxes) == len(r.scores)
        assert [t["id"] for t in frame["tracks"]] == r.ids.tolist() and frame["mot_frame"] == r.frame + 1
        rows = [m for m in mot if int(m[0]) == r.mot_frame]
        assert [int(m[1]) for m in rows] == r.ids.tolist() and all(m[7:] == ["-1", "-1", "-1"] for m in rows)
        np.testing.assert_allclose([[float(v) for v in m[2:4]] for m in rows], r.boxes[:, :2].reshape(-1, 2),
                                   atol=0.01)
        labels = out / "labels" / f"shapes_{r.mot_frame}.txt"
        assert [int(line.split()[-1]) for line in labels.read_text().splitlines()] == r.ids.tolist()
    ids = {i for r in results for i in r.ids.tolist()}
    assert {int(p.name) for p in (out / "crops" / "shapes").iterdir()} == ids
    cap = cv2.VideoCapture(str(out / "shapes.mp4"))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 6
    cap.release()


def test_each_video_and_frame_folder_is_its_own_sequence(tiny_weights, tmp_path):
    clip = shapes_clip(tmp_path / "data", frames=3)
    frames = tmp_path / "seq" / "img1"  # MOTChallenge layout: the sequence is named after img1's parent
    frames.mkdir(parents=True)
    for i, image in enumerate(render(3)[0], start=1):
        cv2.imwrite(str(frames / f"{i:06d}.jpg"), image)
    results = track(tiny_weights, [clip / "shapes.mp4", frames], LOW_TRACKER, save_dir=tmp_path / "run", **LOW_CONF)
    assert [r.sequence for r in results] == ["shapes"] * 3 + ["seq"] * 3
    assert [r.mot_frame for r in results] == [1, 2, 3] * 2
    assert results[2].ids.max() > 1 and results[3].ids.min() == 1  # ids start again
    assert (tmp_path / "run" / "mot" / "seq.txt").is_file() and len(list((tmp_path / "run" / "seq").glob("*.jpg"))) == 3


def test_frames_without_confirmed_tracks_show_no_boxes(tiny_weights, tmp_path):
    """A difference from ultralytics on purpose: where no track is confirmed it passes on the frame's raw
    detections (without ids); every box of a result here has an id."""
    images = render(3)[0]
    detected = predict(tiny_weights, images, **LOW_CONF)
    tracked = track(tiny_weights, images, "bytetrack", **LOW_CONF)  # every score is under new_track_thresh
    assert all(len(r.boxes) == 6 for r in detected)
    assert all(len(r.boxes) == len(r.ids) == 0 for r in tracked)


def test_predict_stream_results_carry_their_image_and_lists_do_not(tiny_weights, tmp_path):
    clip = shapes_clip(tmp_path / "data", frames=2)
    streamed = list(predict(tiny_weights, clip / "shapes.mp4", stream=True, **LOW_CONF))
    listed = predict(tiny_weights, clip / "shapes.mp4", **LOW_CONF)
    assert all(r.image is not None and r.image.shape == (256, 320, 3) for r in streamed)
    assert all(r.image is None for r in listed)


# The moving-shapes video


def test_shapes_video_has_crossing_hidden_and_returning_objects(tmp_path):
    images, rows = render(60)
    again_images, again_rows = render(60)
    assert rows == again_rows and all(np.array_equal(a, b) for a, b in zip(images, again_images))
    frames = {i: [r[0] for r in rows if r[1] == i] for i in range(1, 6)}
    gaps = {i: int(np.diff(f).max()) for i, f in frames.items()}
    assert gaps[1] > 1 and gaps[2] == 1  # 1 and 2 cross, 2 in front: 1 is hidden for a few frames
    assert gaps[3] > 5 and gaps[4] > 5  # 3 leaves the frame and comes back; 4 is hidden behind 5 and shows again
    folder = generate_shapes_video(tmp_path, frames=60)
    assert generate_shapes_video(tmp_path, frames=60) == folder  # reused
    gt = (folder / "shapes" / "gt" / "gt.txt").read_text().splitlines()
    assert len(gt) == len(rows) and "seqLength=60" in (folder / "shapes" / "seqinfo.ini").read_text()
    cap = cv2.VideoCapture(str(folder / "shapes.mp4"))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 60
    cap.release()


# Scoring


def test_trackeval_scores_perfect_and_swapped_tracks(tmp_path):
    clip = shapes_clip(tmp_path / "data", frames=30)
    gt = (clip / "shapes" / "gt" / "gt.txt").read_text().splitlines()
    perfect = tmp_path / "perfect" / "mot"
    perfect.mkdir(parents=True)
    (perfect / "shapes.txt").write_text("".join(f"{','.join(r.split(',')[:6])},1,-1,-1,-1\n" for r in gt))
    scores = evaluate_tracks(clip, perfect, {"shapes": 30})
    assert scores["shapes"]["HOTA"] == scores["shapes"]["MOTA"] == scores["shapes"]["IDF1"] == 1.0
    swapped = tmp_path / "swapped" / "mot"
    swapped.mkdir(parents=True)
    rows = [r.split(",") for r in gt]
    for r in rows:  # object 1 takes a new id half-way
        if r[1] == "1" and int(r[0]) > 15:
            r[1] = "99"
    (swapped / "shapes.txt").write_text("".join(f"{','.join(r[:6])},1,-1,-1,-1\n" for r in rows))
    scores = evaluate_tracks(clip, swapped, {"shapes": 30})["shapes"]
    assert scores["IDSW"] == 1 and scores["IDF1"] < 1 and scores["MOTA"] < 1 and scores["HOTA"] < 1


def test_cli_track_eval_writes_metrics(tiny_weights, tmp_path, capsys):
    clip = shapes_clip(tmp_path / "data")
    code = main(["track", "--weights", str(tiny_weights), "--source", str(clip / "shapes.mp4"), "--img", "64",
                 "--conf", "0.001", "--max-det", "6", "--device", "cpu", "--eval", str(clip), "--nosave",
                 "--tracker", low_tracker_yaml(tmp_path),
                 "--project", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert code == 0, out
    metrics = json.loads((tmp_path / "runs" / "exp" / "metrics.json").read_text())
    assert set(metrics["shapes"]) >= {"HOTA", "MOTA", "IDF1"} and "HOTA" in out and "shapes" in out
    assert not (tmp_path / "runs" / "exp" / "shapes.mp4").exists()


def test_eval_without_ground_truth_for_the_sequence_is_one_line(tiny_weights, tmp_path, capsys):
    clip = shapes_clip(tmp_path / "data", frames=3)
    (tmp_path / "gt").mkdir()
    code = main(["track", "--weights", str(tiny_weights), "--source", str(clip / "shapes.mp4"), "--img", "64",
                 "--device", "cpu", "--eval", str(tmp_path / "gt"), "--project", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "has no ground truth for the tracked sequence(s) shapes" in err[0]


# A live stream


@pytest.mark.slow  # a second process importing torch, then a second of stream
def test_ctrl_c_stops_a_tracked_stream_and_saves_results(tiny_weights, tmp_path):
    from test_predict_options import MjpegServer

    server = MjpegServer(frames=None, interval=0.02)
    run = tmp_path / "runs" / "exp"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "yolotrain", "track", "--weights", str(tiny_weights), "--source", server.url,
         "--img", "64", "--conf", "0.001", "--max-det", "6", "--device", "cpu", "--tracker", low_tracker_yaml(tmp_path),
         "--project", str(tmp_path / "runs")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        mot = run / "mot" / "stream0.txt"
        while not (mot.exists() and mot.stat().st_size) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # a few more frames
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.close()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    saved = json.loads((run / "stream0.json").read_text())["frames"]
    assert saved and f"{len(saved)} images/frames" in out
    assert len(mot.read_text().splitlines()) == sum(len(f["tracks"]) for f in saved) > 0
    cap = cv2.VideoCapture(str(run / "stream0.mp4"))
    count = 0
    while cap.read()[0]:
        count += 1
    assert count == len(saved)  # the writer was released: a playable file
    assert server.clients_done.wait(10)
