"""Anchor-free models (YOLOv8, YOLO11) against ultralytics' own, on the same weights, images and threads, in one run.

For each model it builds ultralytics' ``DetectionModel`` from its bundled YAML (random weights: speed only, the
mAP columns mean nothing), saves it as an ultralytics checkpoint that both sides load, and measures:

- **step**: one training iteration on the same fixed mosaic batch of coco128. Ours is the trainer's real step
  (``Trainer.train_batch``: targets, ``AnchorFreeLoss``, backward, clipping, optimiser, EMA) with the defaults
  (``--amp auto``: bf16 on CPUs with native bf16) and in float32 (``--amp off``); ultralytics' is its trainer's
  order on the CPU (float32, its AMP is CUDA-only): ``model(batch)`` (``v8DetectionLoss`` with its default
  gains), backward, clipping at 10, SGD with its parameter groups, ``ModelEMA``. The contenders alternate every
  round and each one's median is reported.
- **val**: whole ``val`` passes on the first ``--images`` images of coco128 (model loading included; rectangular
  batches of 32, workers 0): ``yolotrain.val`` (float32, and ``half``: bf16 on the CPU) against
  ``YOLO(weights).val(plots=False)``, alternating, each side's fastest pass.
- **predict**: whole passes over a folder of ``--predict-images`` coco128 images (read, letterbox, model, NMS,
  boxes in image pixels; nothing saved) with a model loaded once per side: ``yolotrain.predict`` on a loaded
  model against ``YOLO.predict(stream=True)``, alternating, each side's fastest pass.

Every pass of either side starts at the same number of PyTorch threads (``--threads``, or PyTorch's default at
the start): ultralytics' ``val`` and ``predict`` set it to CPUs - 1 at their first call (``select_device``), which
would otherwise carry into every later pass of both sides.

Ratios are ultralytics' time over ours: above 1, ours is faster. Ultralytics runs offline (``YOLO_OFFLINE=1``,
settings in a temporary folder, matplotlib's DejaVu Sans standing in for the Arial font it would fetch).

    python benchmarks/bench_anchor_free.py                 # yolov8n and yolo11n (a few minutes on 2 idle cores)
    python benchmarks/bench_anchor_free.py --threads 1     # on a busy machine (the recorded results)
    python benchmarks/bench_anchor_free.py --quick         # yolov8n only, fewer rounds and images
    python benchmarks/bench_anchor_free.py --smoke --out /tmp/af   # tiny sizes: checks the script runs

Writes ``benchmarks/results/anchor_free.json`` and ``anchor_free.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch
from bench_train import profile_steps, reference_train_env, time_alternating
from common import COCO128, ROOT, cpu_model

from yolotrain.data.batch import Batch
from yolotrain.data.sources import link_subset
from yolotrain.engine.prepare import autocast_dtype


def fixed_batch(data: Path, img_size: int, batch_size: int) -> Batch:
    """The first mosaic batch of the training split, as the trainer's loader makes it (float images in 0..1)."""
    from yolotrain.data.augment import AugmentConfig
    from yolotrain.data.loaders import DataConfig, build_loaders

    config = DataConfig(path=str(data), img_size=img_size, batch_size=batch_size, workers=0)
    loaders = build_loaders(config, AugmentConfig(), seed=0, splits=("train",), require_names=True)
    return next(iter(loaders.train))


def reference_checkpoint(name: str, names: list[str], path: Path) -> Path:
    """Ultralytics' ``name`` (random weights, seeded) saved as its trainer saves a checkpoint (float32)."""
    import ultralytics
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel(f"{name}.yaml", nc=len(names), verbose=False)
    model.names = dict(enumerate(names))
    torch.save({"model": model, "ema": None, "train_args": {}, "version": ultralytics.__version__}, path)
    return path


def our_step(weights: Path, data: Path, img_size: int, batch: Batch, project: Path,
             **settings) -> Callable[[], None]:
    """The trainer's own iteration (``Trainer.train_batch``), an optimiser and EMA update every batch."""
    from yolotrain.engine.config import resolve_config
    from yolotrain.engine.trainer import Trainer

    config = resolve_config(None, data=str(data), model=str(weights), img_size=img_size,
                            batch_size=batch.imgs.shape[0], workers=0, autoanchor=False, tensorboard=False,
                            project=str(project), device="cpu", **settings)
    trainer = Trainer(config)
    trainer.setup()
    trainer.ddp.train()
    trainer.accumulate = 1
    counter = iter(range(1, 1 << 30))

    def step() -> None:
        trainer.train_batch(batch, epoch=0, index=0, step=next(counter))

    return step


def reference_step(weights: Path, batch: Batch) -> Callable[[], None]:
    """Ultralytics' iteration as its trainer runs it on the CPU: loss through ``model(batch)`` with the default
    gains, backward, clipping, SGD with its parameter groups (its ``lr0``, ``momentum``, ``weight_decay`` scaled to
    the batch as it scales it for ``nbs`` 64) and its EMA."""
    from ultralytics.cfg import get_cfg
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.nn.tasks import load_checkpoint
    from ultralytics.utils.torch_utils import ModelEMA

    model, _ = load_checkpoint(str(weights), device="cpu", fuse=False)
    args = get_cfg()
    model.args = args
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    model.train()
    batch_size = batch.imgs.shape[0]
    accumulate = max(round(args.nbs / batch_size), 1)
    optimizer = BaseTrainer.build_optimizer(types.SimpleNamespace(), model, name="SGD", lr=args.lr0,
                                            momentum=args.momentum,
                                            decay=args.weight_decay * batch_size * accumulate / args.nbs)
    ema = ModelEMA(model)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    imgs, targets = batch
    inputs = {"img": imgs, "batch_idx": targets[:, 0], "cls": targets[:, 1:2], "bboxes": targets[:, 2:6]}

    def step() -> None:
        loss, _ = model(dict(inputs))
        scaler.scale(loss.sum()).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        ema.update(model)

    return step


def at_threads(threads: int, sides: dict[str, Callable[[], object]]) -> dict[str, Callable[[], object]]:
    """``sides``, each call starting at ``threads`` PyTorch threads whatever the call before it left."""
    import torch

    def pinned(side: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            torch.set_num_threads(threads)
            return side()
        return run

    return {name: pinned(side) for name, side in sides.items()}


def fastest_alternating(sides: dict[str, Callable[[], object]], rounds: int) -> dict[str, dict]:
    """Each side's wall and process CPU seconds per pass, the fewest of each, and the result of its fastest pass;
    the order of the sides rotates every round."""
    passes: dict[str, list[tuple[float, float, object]]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            wall, cpu = time.perf_counter(), time.process_time()
            result = sides[name]()
            passes[name].append((time.perf_counter() - wall, time.process_time() - cpu, result))
    out = {}
    for name, timed in passes.items():
        result = min(timed, key=lambda p: p[0])[2]
        out[name] = {"best_s": min(t for t, _, _ in timed), "best_cpu_s": min(c for _, c, _ in timed),
                     "pass_s": [round(t, 3) for t, _, _ in timed], "pass_cpu_s": [round(c, 3) for _, c, _ in timed],
                     "result": result}
    return out


def val_sides(weights: Path, data: Path, img_size: int, work: Path) -> dict[str, Callable[[], float]]:
    """Whole val passes returning mAP50-95: ours in float32 and in half precision, and ultralytics'."""
    from ultralytics import YOLO

    from yolotrain.eval import val

    common = {"img_size": img_size, "batch_size": 32, "workers": 0, "device": "cpu", "verbose": False}
    return {
        "ours_fp32": lambda: val(str(weights), data, half=False, **common).map,
        "ours_half": lambda: val(str(weights), data, half=True, **common).map,
        "reference": lambda: float(YOLO(str(weights)).val(
            data=str(data), imgsz=img_size, batch=32, workers=0, device="cpu", plots=False,
            verbose=False, save_json=False, project=str(work / "reference-val"), name="val",
            exist_ok=True).box.map),
    }


def predict_sides(weights: Path, folder: Path, img_size: int) -> dict[str, Callable[[], int]]:
    """Whole predict passes over ``folder`` with models loaded once, returning the number of boxes found."""
    from ultralytics import YOLO

    from yolotrain import predict
    from yolotrain.interop import resolve_model

    ours = resolve_model(str(weights))
    reference = YOLO(str(weights))

    def ours_pass(half: bool) -> int:
        return sum(len(r.boxes) for r in predict(ours, folder, img_size=img_size, device="cpu", half=half,
                                                 save=False, stream=True))

    def reference_pass() -> int:
        return sum(len(r.boxes) for r in reference.predict(source=str(folder), imgsz=img_size, device="cpu",
                                                          save=False, verbose=False, stream=True))

    return {"ours_fp32": lambda: ours_pass(False), "ours_half": lambda: ours_pass(True),
            "reference": reference_pass}


def image_folder(source: Path, destination: Path, count: int) -> Path:
    """A folder of symbolic links to the first ``count`` images of ``source``."""
    destination.mkdir(parents=True)
    for image in sorted(source.glob("*.jpg"))[:count]:
        (destination / image.name).symlink_to(image)
    return destination


def summarise(setup: dict, rows: dict[str, dict]) -> tuple[dict, str]:
    """Ratios (ultralytics' time over ours, wall and process CPU) and the Markdown table from the measurements."""
    table = [f"CPU: {setup['cpu']} ({setup['torch_threads']} torch threads), torch {setup['torch']}, "
             f"ultralytics {setup['ultralytics']}; {setup['img_size']} px; step batch {setup['batch_size']}, "
             f"val {setup['val_images']} images, predict {setup['predict_images']} images; our defaults' precision "
             f"on this CPU: {setup['auto_precision']}; 1-minute load average {setup['load_average_1min_at_start']:.1f} "
             f"at the start, {setup['load_average_1min_at_end']:.1f} at the end. Speed-up = ultralytics' time / ours "
             "(> 1: ours faster), wall (process CPU).", "",
             "| model | part | ours (defaults) | ours float32 | ultralytics | speed-up | float32 speed-up |",
             "|---|---|---|---|---|---|---|"]
    summary: dict[str, dict] = {}
    for name, row in rows.items():
        summary[name] = {}
        step = row["step"]
        parts = {"step ms": {side: (step[key]["wall_s"] * 1e3, step[key]["cpu_s"] * 1e3)
                             for side, key in (("ours", "ours"), ("ours_fp32", "ours_fp32"),
                                               ("reference", "reference"))},
                 "val s": {side: (row["val"][key]["best_s"], row["val"][key]["best_cpu_s"])
                           for side, key in (("ours", "ours_half"), ("ours_fp32", "ours_fp32"),
                                             ("reference", "reference"))},
                 "predict s": {side: (row["predict"][key]["best_s"], row["predict"][key]["best_cpu_s"])
                               for side, key in (("ours", "ours_half"), ("ours_fp32", "ours_fp32"),
                                                 ("reference", "reference"))}}
        for part, sides in parts.items():
            (ours, ours_cpu), (fp32, fp32_cpu), (ref, ref_cpu) = sides["ours"], sides["ours_fp32"], sides["reference"]
            summary[name][part] = {"wall": {side: t[0] for side, t in sides.items()},
                                   "cpu": {side: t[1] for side, t in sides.items()},
                                   "speedup": ref / ours, "speedup_cpu": ref_cpu / ours_cpu,
                                   "fp32_speedup": ref / fp32, "fp32_speedup_cpu": ref_cpu / fp32_cpu}
            digits = 0 if part == "step ms" else 2
            table.append(f"| {name} | {part} | {ours:.{digits}f} ({ours_cpu:.{digits}f}) | "
                         f"{fp32:.{digits}f} ({fp32_cpu:.{digits}f}) | {ref:.{digits}f} ({ref_cpu:.{digits}f}) | "
                         f"{ref / ours:.2f}x ({ref_cpu / ours_cpu:.2f}x) | "
                         f"{ref / fp32:.2f}x ({ref_cpu / fp32_cpu:.2f}x) |")
    return {"setup": setup, "summary": summary, "raw": rows}, "\n".join(table) + "\n"


def offline_reference(work: Path) -> None:
    """Ultralytics offline, its settings and fonts (DejaVu Sans standing in for Arial) under ``work``: it looks for
    its fonts in the "Ultralytics" folder of its config dir (validation asks for Arial before it reads a dataset)
    and would try the network for a missing one."""
    env = reference_train_env(work / "reference-config")
    fonts = work / "reference-config" / "Ultralytics"
    fonts.mkdir(parents=True, exist_ok=True)
    for font in ("Arial.ttf", "Arial.Unicode.ttf"):
        shutil.copyfile(work / "reference-config" / font, fonts / font)
    os.environ.update({**{k: env[k] for k in ("YOLO_OFFLINE", "YOLO_CONFIG_DIR", "YOLOV5_CONFIG_DIR")},
                       "ULTRALYTICS_CONFIG_DIR": env["YOLO_CONFIG_DIR"]})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="yolov8n,yolo11n", help="comma list of published anchor-free detectors")
    p.add_argument("--img", type=int, default=320, help="image size of every part")
    p.add_argument("--batch-size", type=int, default=8, help="images in the training step's batch")
    p.add_argument("--rounds", type=int, default=5, help="timed training steps per contender")
    p.add_argument("--images", type=int, default=128, help="coco128 images validated (the subset's val split)")
    p.add_argument("--val-rounds", type=int, default=2, help="val and predict passes per side")
    p.add_argument("--predict-images", type=int, default=32, help="images in the predict folder")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    p.add_argument("--profile", default="", help="model whose steps are profiled into anchor_free_profile.md")
    p.add_argument("--quick", action="store_true", help="yolov8n only, 3 rounds, 32 val and 16 predict images")
    p.add_argument("--smoke", action="store_true", help="yolov8n at 64 px, batch 2, 1 round, 4 images")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="folder for anchor_free.json/.md")
    a = p.parse_args()
    if a.quick:
        a.models, a.rounds, a.images, a.predict_images = "yolov8n", 3, 32, 16
    if a.smoke:
        a.models, a.img, a.batch_size, a.rounds, a.images, a.val_rounds, a.predict_images = \
            "yolov8n", 64, 2, 1, 4, 1, 2
    if not COCO128.is_dir():
        sys.exit(f"needs {COCO128}")
    import importlib.util

    if importlib.util.find_spec("ultralytics") is None:
        sys.exit("needs the reference package ultralytics: pip install '.[parity]'")
    threads = a.threads or torch.get_num_threads()
    work = Path(tempfile.mkdtemp(prefix="bench-anchor-free-"))
    offline_reference(work)
    import ultralytics

    from yolotrain.yamlio import read_yaml

    data = link_subset(COCO128 / "data.yaml", work / "data", a.images)
    names = read_yaml(COCO128 / "data.yaml")["names"]
    names = list(names.values()) if isinstance(names, dict) else list(names)
    folder = image_folder(COCO128 / "images" / "train2017", work / "predict", a.predict_images)
    setup = {"device": "cpu", "cpu": cpu_model(), "cpus": os.cpu_count(), "torch_threads": threads,
             "torch": torch.__version__, "ultralytics": ultralytics.__version__, "img_size": a.img,
             "batch_size": a.batch_size, "rounds": a.rounds, "val_images": a.images, "val_rounds": a.val_rounds,
             "predict_images": a.predict_images,
             "auto_precision": "bf16" if autocast_dtype("auto", torch.device("cpu")) else "fp32",
             "weights": "random (seeded): mAP means nothing", "load_average_1min_at_start": os.getloadavg()[0]}
    batch = fixed_batch(data, a.img, a.batch_size)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict] = {}
    for name in a.models.split(","):
        weights = reference_checkpoint(name, names, work / f"{name}.pt")
        steps = at_threads(threads, {"ours": our_step(weights, data, a.img, batch, work / "runs"),
                                     "ours_fp32": our_step(weights, data, a.img, batch, work / "runs", amp="off"),
                                     "reference": reference_step(weights, batch)})
        rows[name] = {"step": time_alternating(steps, a.rounds)}
        print(name, "step", json.dumps(rows[name]["step"]), flush=True)
        if a.profile == name:
            (out / "anchor_free_profile.md").write_text(
                f"# Where the anchor-free training step spends its time: {name} at {a.img}, batch {a.batch_size}, "
                f"{setup['cpu']}, {torch.get_num_threads()} torch threads, 1-minute load average "
                f"{os.getloadavg()[0]:.1f}\n\n" + profile_steps(steps))
        del steps
        for part, sides in (("val", val_sides(weights, data, a.img, work)),
                            ("predict", predict_sides(weights, folder, a.img))):
            passes = fastest_alternating(at_threads(threads, sides), a.val_rounds)
            rows[name][part] = passes
            print(name, part, json.dumps(passes), flush=True)
    setup["load_average_1min_at_end"] = os.getloadavg()[0]
    result, table = summarise(setup, rows)
    (out / "anchor_free.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "anchor_free.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
