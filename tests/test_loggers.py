"""TensorBoard event files of a run, read back with TensorBoard's own reader; the hint without it."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from yolotrain import train
from yolotrain.data import generate_shapes_dataset
from yolotrain.engine.loggers import RunLoggers


def test_a_run_writes_scalars_lrs_and_a_validation_mosaic(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=8, n_val=4, img_size=64) / "data.yaml"
    run = train(data=str(data), epochs=2, img_size=64, batch_size=4, workers=0, autoanchor=False,
                project=str(tmp_path / "runs"))
    events = EventAccumulator(str(run.save_dir), size_guidance={"images": 0})
    events.Reload()
    tags = events.Tags()
    with (run.save_dir / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    for column, tag in (("train_box", "train/box_loss"), ("mAP50", "metrics/mAP_0.5"), ("lr0", "x/lr0"),
                        ("lr1", "x/lr1"), ("val_obj", "val/obj_loss")):
        assert tag in tags["scalars"], tag
        logged = events.Scalars(tag)
        assert [s.step for s in logged] == [1, 2]
        assert [s.value for s in logged] == pytest.approx([float(r[column]) for r in rows], rel=1e-5)
    assert "val/predictions" in tags["images"]
    image = events.Images("val/predictions")[0]
    assert image.width >= 320 and image.height >= 320 and image.step == 2


def test_without_tensorboard_one_hint_and_no_files(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    lines: list[str] = []
    loggers = RunLoggers(tmp_path, True, lines.append)
    (tmp_path / "results.csv").write_text("epoch,train_box\n1,0.5\n")
    loggers.log_epoch(tmp_path / "results.csv")
    loggers.close()
    assert len(lines) == 1 and "pip install tensorboard" in lines[0]
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["results.csv"]
    assert RunLoggers(tmp_path, False, lines.append).writer is None and len(lines) == 1
