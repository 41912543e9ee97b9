"""AutoAnchor: the reference's best possible recall on the same labels, anchors at least as fit, and the
refit anchors carried by the model into the checkpoint."""

from __future__ import annotations

import json
import logging
import random
import time
import types

import numpy as np
import pytest
import torch
from conftest import coco128_subset

from yolotrain import Yolov5, train
from yolotrain.data.sources import resolve_source
from yolotrain.data.verify import verify_split
from yolotrain.model.anchors import anchor_fit, anchor_fitness, check_anchors, label_sizes
from yolotrain.model.detect import DEFAULT_ANCHORS


def reference_fitness(anchors: np.ndarray, wh: np.ndarray, thr: float = 4.0) -> float:
    """The reference's ``anchor_fitness`` (utils/autoanchor.py), written out: torch, float32."""
    k, wh = torch.tensor(anchors, dtype=torch.float32), torch.tensor(wh, dtype=torch.float32)
    r = wh[:, None] / k[None]
    best = torch.min(r, 1 / r).min(2)[0].max(1)[0]
    return float((best * (best > 1 / thr).float()).mean())


@pytest.fixture(scope="module")
def coco128_labels(coco128, tmp_path_factory):
    root = coco128_subset(tmp_path_factory.mktemp("coco128"), 128)
    index = verify_split(resolve_source(root).train, 80, "train")
    return np.asarray(index.shapes, dtype=np.float64).reshape(-1, 2), index.labels


def test_bpr_and_evolved_anchors_against_the_reference(reference, coco128_labels):
    """coco128 at 320: the stock anchors fall below BPR 0.98 and both sides refit them."""
    shapes, labels = coco128_labels
    from yolov5.utils.autoanchor import check_anchors as reference_check
    from yolov5.utils.general import LOGGER

    ref_model = Yolov5("n", num_classes=80)
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    LOGGER.addHandler(handler)
    level = LOGGER.level
    LOGGER.setLevel(logging.INFO)
    try:
        np.random.seed(0), random.seed(0)
        scale = np.random.uniform(0.9, 1.1, size=(len(shapes), 1))  # the reference's first draw
        np.random.seed(0), random.seed(0)
        dataset = types.SimpleNamespace(shapes=shapes, labels=[np.asarray(x, dtype=np.float32) for x in labels])
        reference_check(dataset, ref_model, thr=4.0, imgsz=320)
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)
    text = " ".join(lines)
    ref_bpr = float(text.split(" Best Possible Recall")[0].split()[-1])
    assert "Done ✅" in text  # the reference replaced its anchors

    # Same labels, same scale draw: the same BPR (the reference prints three decimals).
    stock = np.asarray(DEFAULT_ANCHORS, dtype=np.float64).reshape(-1, 2)
    ours_bpr, _ = anchor_fit(stock, label_sizes(shapes, labels, 320, scale), 4.0)
    assert abs(ours_bpr - ref_bpr) <= 1e-3 and ref_bpr < 0.98

    model = Yolov5("n", num_classes=80)
    report = check_anchors(model, shapes, labels, 320, 4.0, seed=0)
    assert report.replaced and abs(report.bpr_before - ref_bpr) < 0.01 and report.bpr_after > 0.98
    assert "0.9" in report.summary() and "->" in report.summary()
    # Written into the head (grid units), smallest anchors at the finest level.
    pixels = (model.head.anchors * model.head.stride.view(-1, 1, 1)).view(-1, 2).numpy()
    np.testing.assert_allclose(pixels, report.anchors, rtol=1e-6)
    assert (np.diff(pixels.prod(1)) >= 0).all()

    wh = label_sizes(shapes, labels, 320)
    wh = wh[(wh >= 2.0).any(1)]
    ref_anchors = (ref_model.head.anchors * ref_model.head.stride.view(-1, 1, 1)).view(-1, 2).numpy()
    ours, theirs = reference_fitness(report.anchors, wh), reference_fitness(ref_anchors, wh)
    assert ours >= theirs, (ours, theirs)
    assert anchor_fitness(report.anchors, wh, 4.0) == pytest.approx(ours, rel=1e-6)


def test_good_anchors_are_kept(coco128_labels):
    shapes, labels = coco128_labels
    model = Yolov5("n", num_classes=80)
    before = model.head.anchors.clone()
    report = check_anchors(model, shapes, labels, 640, 4.0, seed=0)
    assert not report.replaced and report.bpr_before > 0.98 and "fit the data" in report.summary()
    assert torch.equal(model.head.anchors, before)


def test_training_refits_the_anchors_into_the_checkpoint_unless_turned_off(tmp_path, capsys, coco_mini):
    common = dict(data=str(coco_mini), img_size=64, batch_size=4, epochs=1, workers=0, val=False, plots=False,
                  project=str(tmp_path))
    run = train(**common, name="auto")
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("AutoAnchor:"))
    assert "->" in line and "best possible recall" in line
    saved = np.asarray(json.loads(run.last.with_suffix(".json").read_text())["anchors"]).reshape(-1, 2)
    assert not np.allclose(saved, np.asarray(DEFAULT_ANCHORS).reshape(-1, 2))
    from yolotrain.interop import load_checkpoint

    model, _ = load_checkpoint(run.last)
    np.testing.assert_allclose((model.head.anchors * model.head.stride.view(-1, 1, 1)).view(-1, 2).numpy(), saved,
                               rtol=1e-5)
    kept = train(**common, name="off", autoanchor=False)
    saved = np.asarray(json.loads(kept.last.with_suffix(".json").read_text())["anchors"]).reshape(-1, 2)
    np.testing.assert_allclose(saved, np.asarray(DEFAULT_ANCHORS).reshape(-1, 2))
    assert "AutoAnchor" not in capsys.readouterr().out


def test_the_reference_spelling_turns_it_off():
    from yolotrain.cli import build_parser

    parser = build_parser()._subparsers._group_actions[0].choices["train"]
    assert parser.parse_args(["--noautoanchor"]).autoanchor is False
    assert parser.parse_args(["--no-autoanchor"]).autoanchor is False
    assert "autoanchor" not in vars(parser.parse_args([]))


def test_a_million_boxes_are_refitted_from_a_seeded_sample_with_a_progress_line(monkeypatch):
    from yolotrain.model import anchors

    monkeypatch.setattr(anchors, "MAX_FIT_BOXES", 2000)  # the mechanism, at a size this test can afford
    rng = np.random.default_rng(0)
    # Long thin boxes (60-400 x 3-6 pixels at 640), which the default anchors do not fit.
    boxes = np.column_stack([np.zeros(1_000_000), np.full((1_000_000, 2), 0.5), rng.uniform(0.1, 0.6, 1_000_000),
                             rng.uniform(0.005, 0.01, 1_000_000)]).astype(np.float32)
    shapes = np.array([[640, 640]])
    results, lines = [], []
    for _ in range(2):
        start = time.perf_counter()
        report = check_anchors(Yolov5("n", num_classes=1), shapes, [boxes], 640, 4.0, seed=3, generations=50,
                               log=lines.append)
        assert time.perf_counter() - start < 10
        results.append(report.anchors)
    assert report.replaced and report.bpr_after > 0.98
    np.testing.assert_array_equal(results[0], results[1])  # the sample is drawn from the seed
    assert lines[0] == (f"AutoAnchor refit: best possible recall {report.bpr_before:.4f} is below 0.98, fitting new "
                        "anchors to 2000 boxes (a seeded sample of the 1000000) in 50 generations ...")
