"""Tiled prediction on a large aerial image finds the small objects that whole-image prediction misses: an OBB model
trained on ``yolotrain data split``'s tiles of a dota8 harbour, then asked about the whole 1024 px image at the tiles'
size (each ship shrinks to a few pixels) and with ``slice`` at the image's own size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from yolotrain import predict, train
from yolotrain.data.sources import img2label_path, link_subset
from yolotrain.data.tiles import split_oriented_dataset
from yolotrain.rotated import corners_to_xywhr, probiou

SHARED = Path(__file__).resolve().parents[2] / "shared"
DOTA8 = SHARED / "datasets" / "dota8"
YOLOV5N = SHARED / "weights" / "yolov5n.pt"
# dota8's first training image (P0861__1024__0___1648): 110 labelled objects in 1024 x 1024 px, 105 ships and 5
# small vehicles of about 50 x 17 px.
IMAGE_SIZE = 1024
TILE = 256
MATCH = 0.5  # ProbIoU for a prediction to find a labelled object


@pytest.mark.slow  # a short training: one to three minutes on a 2-core CPU, as busy as it is
@pytest.mark.skipif(not (DOTA8 / "images").is_dir() or not YOLOV5N.is_file(),
                    reason="needs ../shared/datasets/dota8 and ../shared/weights/yolov5n.pt")
def test_tiled_prediction_finds_the_small_objects_that_whole_image_prediction_misses(tmp_path):
    one_image = link_subset(DOTA8 / "dota8.yaml", tmp_path / "harbour", 1)
    image = next((one_image.parent / "images" / "val").iterdir())
    tiles = split_oriented_dataset(one_image, tmp_path / "tiles", size=TILE, gap=TILE // 4)
    for label in (tmp_path / "tiles" / "labels").rglob("*.txt"):  # train on the tiles with objects: half the time
        if not label.read_text().strip():
            label.unlink()
            (tmp_path / "tiles" / "images" / label.parent.name / f"{label.stem}.jpg").unlink()
    assert yaml.safe_load(tiles.read_text())["names"][1] == "ship"
    # yolov5n.pt's backbone and neck with a fresh OBB head learn the ships in a few dozen steps with AdamW, one step
    # per batch, no warm-up and no mosaic (the tiles as they are).
    run = train(model="yolov5nu-obb", pretrained=str(YOLOV5N), data=str(tiles), epochs=20, img_size=TILE,
                batch_size=8, nominal_batch=8, optimizer="AdamW", lr0=0.002, warmup_epochs=0, mosaic=0.0, val=False,
                plots=False, project=str(tmp_path / "runs"), device="cpu", workers=0)

    rows = np.loadtxt(img2label_path(image), ndmin=2)
    labels = torch.as_tensor(corners_to_xywhr(rows[:, 1:].reshape(-1, 4, 2) * IMAGE_SIZE), dtype=torch.float32)
    assert len(labels) == 110
    whole = predict(run.best, image, img_size=TILE, conf=0.25, half=False)[0]
    tiled = predict(run.best, image, img_size=IMAGE_SIZE, slice=TILE, conf=0.25, half=False)[0]
    found = {name: int((probiou(labels, result.rotated.float()) >= MATCH).any(1).sum()) if len(result.rotated) else 0
             for name, result in (("whole", whole), ("tiled", tiled))}
    print(f"labelled objects found: whole image {found['whole']}, tiled {found['tiled']} of {len(labels)}")
    assert found["whole"] <= 0.1 * len(labels), found  # a ship shrinks to about 13 x 4 px at 256
    assert found["tiled"] >= 0.7 * len(labels), found
