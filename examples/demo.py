"""The demo: train yolov5n on the built-in shapes dataset, evaluate the best weights, predict on images,
track the moving-shapes video with ByteTrack and BoT-SORT and score the tracks (HOTA, MOTA, IDF1).

Runs on a CPU in a few minutes and downloads nothing. ``make demo`` runs it.
"""

from pathlib import Path

import yolotrain
from yolotrain.data import generate_shapes_dataset
from yolotrain.data.shapes_video import generate_shapes_video
from yolotrain.track.evaluate import evaluate_tracks
from yolotrain.track.run import format_scores, track


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


if __name__ == "__main__":
    main()
