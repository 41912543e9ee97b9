"""Segmentation speed and memory against the reference's ``segment/train.py`` and ``segment/val.py``, in one run.

yolov5n-seg started from the official detection weights (``--cfg yolov5n-seg.yaml --weights yolov5n.pt``)
on ``coco128-seg``, batch 16, overlap masks at 1/4:

- **step**: the trainer's real iteration (``Trainer.train_batch`` with the batch's masks: targets, loss,
  backward, clipping, optimiser, EMA) against the reference's ``SegmentationModel``, segmentation
  ``ComputeLoss``, ``smart_optimizer`` groups, clipping and ``ModelEMA`` in its ``train.py`` order, on the
  same fixed mosaic batch, the order of the contenders rotating each round (medians reported);
- **command**: whole ``yolotrain train`` and reference ``segment/train.py`` commands (2 loader workers,
  mosaic on, AutoAnchor off, ``--noval``) of 3 epochs, twice each in alternating order: the steady-state
  epoch is the time between the first two rows of each ``results.csv``; wall and CPU time from ``wait4``,
  peak RSS of the main process; each side's best round;
- **val**: ``val`` of the same network (our model, and the reference's ``SegmentationModel`` holding its
  weights) on the same images, loader construction included, box and mask metrics, each pass in a process
  of its own (so that its peak RSS is its own; both processes import both packages and build the network
  alike); passes rotate and each side's fastest is reported. Ours runs twice: with its defaults (half
  precision where the device computes it natively: bfloat16 on CPUs with AVX512-BF16 or AMX; JPEGs at least
  twice the size decoded reduced) and as the reference computes (``half=False``, its precision on the CPU, and
  ``reduced_decode=False``, its pixels), whose scores the smoke test holds equal to the reference's.

    python benchmarks/bench_segment.py                  # about 6 minutes on 2 cores
    python benchmarks/bench_segment.py --smoke --out /tmp/segment.json   # tiny: checks the script runs

Writes ``benchmarks/results/segment.json`` (keeping the ``fine_tune`` record already there: the yolov5n-seg
fine-tune of the README, run on its own).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch
from bench_train import reference_train_env, run_command, time_alternating
from common import ROOT, SHARED, YOLOV5N, alias_numpy_trapz

from yolotrain.data.segment import SegmentBatch
from yolotrain.data.sources import link_subset

COCO128_SEG = SHARED / "datasets" / "coco128-seg"
BATCH = 16
MODEL_CFG = "yolov5n-seg.yaml"
# The reference's segment/train.py run as a program with numpy 2's name for the function it calls;
# nothing else in it changes.
# Our val passes: the defaults (half=None: bf16 where native; reduced decode), and the reference's computation.
OUR_VAL_SIDES = {"ours": {"half": None}, "ours_fp32": {"half": False, "reduced_decode": False}}
REFERENCE_TRAIN = (
    "import sys, numpy as np; np.trapz = np.trapezoid; path = sys.argv[1]; sys.argv = sys.argv[1:]; "
    "exec(compile(open(path).read(), path, 'exec'), {'__name__': '__main__', '__file__': path})")


def cpu_model() -> str:
    """The processor's name as Linux reports it (``platform.processor()`` is empty there)."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.is_file() else []
    return names[0] if names else platform.processor() or platform.machine()


def fixed_batch(data: Path, img_size: int) -> SegmentBatch:
    """The first mosaic batch (images, targets, overlap masks), as the trainer's loader makes it."""
    from yolotrain.data.augment import AugmentConfig
    from yolotrain.data.loaders import DataConfig, build_loaders

    config = DataConfig(path=str(data), img_size=img_size, batch_size=BATCH, workers=0)
    loaders = build_loaders(config, AugmentConfig(), seed=0, splits=("train",), require_names=True, kind="masks")
    return next(iter(loaders.train))


def our_model():
    """Our yolov5n-seg with the official detection weights transferred (the trainer's ``pretrained``)."""
    from yolotrain import Yolov5
    from yolotrain.interop import load_model

    torch.manual_seed(0)
    model = Yolov5("n", num_classes=80, task="segment")
    detector = load_model(YOLOV5N)
    model.load_matching(detector.state_dict())
    model.names = list(detector.names)
    return model


def our_step(data: Path, img_size: int, project: Path) -> Callable[[], None]:
    """The trainer's own iteration with an optimiser and EMA update every batch."""
    from yolotrain.engine.config import resolve_config
    from yolotrain.engine.trainer import Trainer

    config = resolve_config(None, data=str(data), model=Path(MODEL_CFG).stem, pretrained=str(YOLOV5N),
                            img_size=img_size, batch_size=BATCH, workers=0, autoanchor=False, tensorboard=False,
                            project=str(project), device="cpu")
    trainer = Trainer(config)
    trainer.setup()
    trainer.ddp.train()
    trainer.accumulate = 1
    batch = fixed_batch(data, img_size)
    counter = iter(range(1, 1 << 30))

    def step() -> None:
        trainer.train_batch(batch, 0, 0, next(counter))

    return step


def reference_model(reference_root: Path):
    """The reference's yolov5n-seg holding our transferred model's tensors (same names and shapes)."""
    from yolov5.models.yolo import SegmentationModel

    model = SegmentationModel(str(reference_root / "models" / "segment" / MODEL_CFG), nc=80)
    ours = our_model()
    model.load_state_dict(ours.state_dict())
    model.names = ours.names
    return model


def reference_step(reference_root: Path, data: Path, img_size: int) -> Callable[[], None]:
    """The reference's segmentation iteration, as its segment/train.py runs it on the CPU (no AMP)."""
    import yaml
    from yolov5.utils.segment.loss import ComputeLoss
    from yolov5.utils.torch_utils import ModelEMA, smart_optimizer

    model = reference_model(reference_root)
    hyp = yaml.safe_load((reference_root / "data" / "hyps" / "hyp.scratch-low.yaml").read_text())
    nl = model.model[-1].nl
    hyp["box"] *= 3 / nl
    hyp["obj"] *= (img_size / 640) ** 2 * 3 / nl
    hyp["label_smoothing"] = 0.0
    model.nc, model.hyp = 80, hyp
    model.train()
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"] * BATCH * 4 / 64)
    ema = ModelEMA(model)
    compute_loss = ComputeLoss(model, overlap=True)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    batch = fixed_batch(data, img_size)
    imgs, targets, masks = batch.imgs, batch.targets, batch.masks

    def step() -> None:
        with torch.autocast("cpu", enabled=False):
            loss, _ = compute_loss(model(imgs), targets, masks=masks.float())
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        ema.update(model)

    return step


def commands(data: Path, img_size: int, epochs: int, rounds: int, work: Path,
             reference_root: Path) -> dict[str, list[dict]]:
    """Each side's whole ``epochs``-epoch ``--noval`` fine-tuning command, ``rounds`` times, the order of
    the sides flipping every round."""
    env = reference_train_env(work / "reference-config")
    common = ["--cfg", MODEL_CFG, "--weights", str(YOLOV5N), "--data", str(data), "--img", str(img_size),
              "--workers", "2", "--epochs", str(epochs), "--batch-size", str(BATCH), "--device", "cpu",
              "--exist-ok", "--noplots", "--noval", "--noautoanchor"]
    runs: dict[str, list[dict]] = {"reference": [], "ours": []}
    for r in range(rounds):
        for side in ("reference", "ours") if r % 2 == 0 else ("ours", "reference"):
            project, name = work / side, f"run{r}"
            if side == "reference":
                argv = [sys.executable, "-c", REFERENCE_TRAIN, str(reference_root / "segment" / "train.py"), *common,
                        "--project", str(project), "--name", name]
            else:
                argv = [sys.executable, "-m", "yolotrain", "train", *common, "--project", str(project), "--name", name]
            runs[side].append(run_command(argv, env, work, project / name / "results.csv"))
            print(side, json.dumps(runs[side][-1]), flush=True)
    return runs


def val_pass(side: str, data: Path, img_size: int, reference_root: Path, work: Path) -> dict[str, float]:
    """One timed ``val`` of ``side`` on the same network: ours, or the reference's ``segment/val.run`` with
    its own rect loader (as its standalone run builds it); seconds, box and mask mAP50-95."""
    import yolov5.utils.general as general
    from yolov5.segment import val as reference_val
    from yolov5.utils.segment.dataloaders import create_dataloader

    from yolotrain.eval import val

    general.check_font = lambda *a, **k: None
    general.time = types.SimpleNamespace(time=lambda: 0.0)  # else its NMS drops boxes on a slow CPU
    if side in OUR_VAL_SIDES:
        model = our_model().eval()
        started = time.perf_counter()
        result = val(model, data, img_size=img_size, batch_size=32, device="cpu", workers=0, plots=False,
                     verbose=False, **OUR_VAL_SIDES[side])
        return {"s": time.perf_counter() - started, "box_map": result.map, "mask_map": result.masks.map}
    model = reference_model(reference_root).eval()
    started = time.perf_counter()
    data_dict = general.check_dataset(str(data))
    loader = create_dataloader(data_dict["val"], img_size, 32, 32, False, pad=0.5, rect=True, workers=0,
                               overlap_mask=True, mask_downsample_ratio=4)[0]
    results = reference_val.run(data_dict, model=model, dataloader=loader, imgsz=img_size, plots=False, half=False,
                                overlap=True, mask_downsample_ratio=4, save_dir=work / "ref-val")[0]
    return {"s": time.perf_counter() - started, "box_map": float(results[3]), "mask_map": float(results[7])}


def val_rows(data: Path, img_size: int, rounds: int, work: Path) -> dict[str, list[dict[str, float]]]:
    """Each side's val passes, each in a process of its own (its peak RSS), the order rotating every round."""
    env = reference_train_env(work / "reference-config")
    sides = [*OUR_VAL_SIDES, "reference"]
    passes: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for r in range(rounds):
        for side in sides[r % len(sides):] + sides[:r % len(sides)]:
            out = work / f"val-{side}-{r}.json"
            argv = [sys.executable, __file__, "--val-pass", side, "--data", str(data), "--img", str(img_size),
                    "--out", str(out)]
            measured = run_command(argv, env, work, work / "no-results.csv")
            passes[side].append({**json.loads(out.read_text()), "peak_rss_gb": measured["peak_rss_gb"]})
            print(side, "val", json.dumps(passes[side][-1]), flush=True)
    return passes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--img", type=int, default=256)
    p.add_argument("--images", type=int, default=100, help="coco128-seg images (the train and val split)")
    p.add_argument("--rounds", type=int, default=6, help="timed training steps per contender")
    p.add_argument("--val-rounds", type=int, default=2, help="val passes per side")
    p.add_argument("--epochs", type=int, default=3, help="epochs of the whole commands (0: no command rows)")
    p.add_argument("--command-rounds", type=int, default=2, help="whole commands per side, in alternating order")
    p.add_argument("--smoke", action="store_true", help="64 px, 16 images, 1 round, no commands")
    p.add_argument("--note", default="", help="how loaded the machine was, recorded with the results")
    p.add_argument("--val-pass", choices=(*OUR_VAL_SIDES, "reference"), help=argparse.SUPPRESS)  # one val, in a child
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "segment.json"))
    a = p.parse_args()
    if a.smoke:
        a.img, a.images, a.rounds, a.val_rounds, a.epochs = 64, 16, 1, 1, 0
    if not (COCO128_SEG.is_dir() and YOLOV5N.is_file()):
        sys.exit(f"needs {COCO128_SEG} and {YOLOV5N}")
    alias_numpy_trapz()
    import yolov5

    reference_root = Path(yolov5.__file__).parent
    if a.val_pass:  # the environment and the data come from the parent run
        out = Path(a.out)
        out.write_text(json.dumps(val_pass(a.val_pass, Path(a.data), a.img, reference_root, out.parent)))
        return
    work = Path(tempfile.mkdtemp(prefix="bench-segment-"))
    os.environ.update(reference_train_env(work / "reference-config"))
    data = link_subset(COCO128_SEG / "data.yaml", work / "data", a.images)
    setup = {"device": "cpu", "model": "yolov5n-seg from yolov5n.pt", "img_size": a.img, "batch_size": BATCH,
             "images": a.images, "cpu": cpu_model(), "cpus": os.cpu_count(),
             "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
             "load_average_1min_at_start": os.getloadavg()[0], "note": a.note}
    steps = time_alternating({"ours": our_step(data, a.img, work / "runs"),
                              "reference": reference_step(reference_root, data, a.img)}, a.rounds)
    print("steps", json.dumps(steps), flush=True)
    passes = val_rows(data, a.img, a.val_rounds, work)
    val_s = {side: min(p["s"] for p in runs) for side, runs in passes.items()}
    runs = commands(data, a.img, a.epochs, a.command_rounds, work, reference_root) if a.epochs else {}
    setup["load_average_1min_at_end"] = os.getloadavg()[0]
    result = {
        "setup": setup,
        "step": {"ours_ms": steps["ours"]["wall_s"] * 1e3, "reference_ms": steps["reference"]["wall_s"] * 1e3,
                 "speedup": steps["reference"]["wall_s"] / steps["ours"]["wall_s"], "raw": steps},
        "val": {"ours_images_per_s": a.images / val_s["ours"], "reference_images_per_s": a.images / val_s["reference"],
                "speedup": val_s["reference"] / val_s["ours"],
                "ours_fp32_images_per_s": a.images / val_s["ours_fp32"],
                "fp32_speedup": val_s["reference"] / val_s["ours_fp32"],
                "peak_rss_gb": {side: max(p["peak_rss_gb"] for p in runs) for side, runs in passes.items()},
                "passes": passes},
    }
    if runs:  # each side's best round (the least disturbed by other work), the highest memory of any
        epoch = {side: min(r["epoch_rows_at_s"][1] - r["epoch_rows_at_s"][0] for r in rs) for side, rs in runs.items()}
        command = {side: min(r["wall_s"] for r in rs) for side, rs in runs.items()}
        result["command"] = {"epochs": a.epochs, "rounds": a.command_rounds, "steady_epoch_s": epoch,
                             "steady_epoch_speedup": epoch["reference"] / epoch["ours"], "command_s": command,
                             "command_speedup": command["reference"] / command["ours"],
                             "cpu_s": {side: min(r["cpu_s"] for r in rs) for side, rs in runs.items()},
                             "peak_rss_gb": {side: max(r["peak_rss_gb"] for r in rs) for side, rs in runs.items()},
                             "runs": runs}
    out = Path(a.out)
    if out.is_file() and "fine_tune" in (recorded := json.loads(out.read_text())):
        result = {"fine_tune": recorded["fine_tune"], **result}  # the fine-tune record is not re-measured here
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
