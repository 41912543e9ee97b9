"""The demo: train yolov5n on the built-in shapes dataset, evaluate the best weights, predict on images,
track the moving-shapes video with ByteTrack and BoT-SORT and score the tracks (HOTA, MOTA, IDF1); then
train a pose model (each shape's four corner keypoints) and an oriented-box model (turned shapes) on the
shapes' other label variants, both started from the detector's backbone and neck, and evaluate and predict
with each.

Runs on a CPU and downloads nothing (on 2 cores, 25 minutes here, the pose and oriented-box parts about 5 of them).
``make demo`` runs it.
"""

from pathlib import Path

import yolotrain
from yolotrain.data import generate_shapes_dataset
from yolotrain.data.shapes_video import generate_shapes_video
from yolotrain.track.evaluate import evaluate_tracks
from yolotrain.track.run import format_scores, track

# The pose and oriented-box runs: YOLOv5u heads whose backbone and neck start from the detection run's yolov5n
# (the same layers, trained on the same kind of pictures), an optimiser step per batch of 16 as in that run, and no
# warm-up (which lasts at least 100 steps: most of so short a run). From scratch, 10 such epochs do not learn
# (yolov8n-obb: mAP50 0.008).
OTHER_TASKS = {"pose": "yolov5nu-pose", "obb": "yolov5nu-obb"}
OTHER_TASKS_EPOCHS = 10


def main() -> None:
    data = generate_shapes_dataset()
    print(f"Dataset: {data}")
    config = yolotrain.resolve_config(project="runs/demo", name="train")
    run = yolotrain.train(config)
    best = run.best.with_suffix(".json")
    metrics = yolotrain.val(best, data=str(data / "data.yaml"), img_size=config.data.img_size, batch_size=16)
    print(f"\nBest weights: mAP50 {metrics.map50:.3f}, mAP50-95 {metrics.map:.3f}")
    images = sorted((data / "images" / "val").iterdir())[:8]
    out = Path(run.save_dir) / "predictions"
    results = yolotrain.predict(best, images, img_size=config.data.img_size, save_dir=out)
    found = sum(len(r.boxes) for r in results)
    print(f"Predicted {found} objects in {len(results)} images; drawings in {out}")
    video = generate_shapes_video()
    for tracker in ("bytetrack", "botsort"):
        out = Path(run.save_dir) / tracker
        tracks = track(best, video / "shapes.mp4", tracker, save_dir=out, img_size=config.data.img_size)
        scores = evaluate_tracks(video, out / "mot", {"shapes": len(tracks)})
        print(f"\n{tracker}: {out / 'shapes.mp4'}\n{format_scores(scores)}")
    for labels, model in OTHER_TASKS.items():
        other_task(labels, model, best, config.data.img_size)


def other_task(labels: str, model: str, detector: Path, img_size: int) -> None:
    """Train ``model`` from the ``detector``'s backbone and neck on the shapes' ``labels`` variant, evaluate its best
    weights and predict on images."""
    data = generate_shapes_dataset(labels=labels)
    print(f"\nDataset ({labels}): {data}")
    run = yolotrain.train(model=model, pretrained=str(detector), data=str(data / "data.yaml"), img_size=img_size,
                          epochs=OTHER_TASKS_EPOCHS, nominal_batch=16, warmup_epochs=0, project="runs/demo",
                          name=labels)
    best = run.best.with_suffix(".json")
    metrics = yolotrain.val(best, data=str(data / "data.yaml"), img_size=img_size, batch_size=16)
    line = f"\n{model} best weights: mAP50 {metrics.map50:.3f}, mAP50-95 {metrics.map:.3f}"
    if metrics.keypoints is not None:
        line += f"; keypoints mAP50 {metrics.keypoints.map50:.3f}, mAP50-95 {metrics.keypoints.map:.3f}"
    print(line)
    images = sorted((data / "images" / "val").iterdir())[:8]
    out = Path(run.save_dir) / "predictions"
    results = yolotrain.predict(best, images, img_size=img_size, save_dir=out)
    found = sum(len(r.boxes) for r in results)
    print(f"Predicted {found} objects in {len(results)} images; drawings in {out}")


if __name__ == "__main__":
    main()
