"""How the data path's cost grows with image resolution and dataset size, ours against the reference's
(``yolov5.utils.dataloaders.LoadImagesAndLabels``) in the same run.

Loader rows: training-loader images/s at 640 (mosaic on, scratch-low, batch 16, workers 0: one process) on a
copy of coco128 and on coco128 upscaled 4x with Lanczos (~2560 px, JPEG quality 92, generated into a temporary
folder), without an image cache (yolotrain ``cache_mb=0``) and with the RAM cache (``cache=ram``, the reference's
``cache_images="ram"``). Ours as ``--workers 0`` builds batches (a batch's samples on the threads of
:func:`~yolotrain.data.sample_threads.default_sample_threads`), on one thread, and on one thread with
``reduced_decode`` off (the reference's full decode); images per CPU second of the process give the per-core
figures. Our batches are float32 0..1, the reference's uint8: it is also timed with the ``imgs.float() / 255`` its
``train.py`` does before the model ("reference + float 0..1"). Each loader runs one warm-up epoch, then
``--rounds`` timed epochs, the contenders taking turns; each row gives each loader's best epoch (the one least
slowed by other work on a shared machine). ``--no-datasets`` measures the loader rows alone, keeping the other
rows of ``scaling.json``.

Dataset-size rows: synthetic YOLO datasets of 1k, 10k, ... small JPEGs (160 x 120, COCO's label density: a
Poisson number of boxes per image, mean 7.3, 80 classes). For each tool, in a fresh process: the first run's
verification (every image and label checked, the label cache written), then a second process's start-up from
that cache; wall and CPU seconds (the process and its pool workers), the process's peak RSS above its RSS after
imports, and the cache file's size. Ours is ``list_images`` + ``verify_split`` + ``DetectionDataset``; the
reference's ``LoadImagesAndLabels(path, 640, 16)``.

Model-size rows (``--models``): yolov5 n/s/m at 320 and 640 and n6 at 1280 (architectures from their YAMLs;
n from the official weights, the others randomly initialised, which does not change the cost of a training
step or command), each with the training step of ``bench_train`` (ours with the defaults and with ``--amp
off``, the reference's model + ComputeLoss + optimiser + EMA; batch 16, the contenders alternating, medians),
``val`` of ``bench_eval`` (ours float32 and bfloat16, the reference's ``val.run``; alternating, best pass), and
``bench_train``'s whole 3-epoch command with validation every epoch (subprocesses, sides rotating), all on the
first ``--subset`` images of coco128 (train and val split alike). They are added to an existing
``scaling.json`` next to its data-path rows.

Usage: python benchmarks/bench_scaling.py [--images N] [--rounds N] [--img-size PX] [--dataset-sizes 1000 10000]
       [--out-dir DIR]
       python benchmarks/bench_scaling.py --models n@320,n@640,s@320,s@640,m@320,m@640,n6@1280 [--parts step val
       command] [--subset 16] [--step-rounds 3]
       python benchmarks/bench_scaling.py --models n6@1280 --add-command-sample [--first reference] --subset 8
       --batch 2  (one more sample of rows already measured: the whole command only, kept beside the others)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import cv2
import numpy as np
from common import COCO128, ROOT, copy_images, cpu_model, reference_env

UPSCALE = 4
JPEG_QUALITY = 92
SMALL_JPEG = (160, 120)
BOXES_PER_IMAGE = 7.3  # COCO train2017: 860k boxes over 118k images


def upscaled_copy(images: Path, root: Path, factor: int = UPSCALE) -> Path:
    """``images`` (with their labels) enlarged ``factor`` times with Lanczos and saved as JPEG quality 92."""
    out_images, out_labels = root / "images" / images.name, root / "labels" / images.name
    out_images.mkdir(parents=True), out_labels.mkdir(parents=True)
    for image in sorted(images.iterdir()):
        im = cv2.imread(str(image), cv2.IMREAD_COLOR)
        big = cv2.resize(im, (im.shape[1] * factor, im.shape[0] * factor), interpolation=cv2.INTER_LANCZOS4)
        cv2.imwrite(str(out_images / f"{image.stem}.jpg"), big, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        label = images.parent.parent / "labels" / images.name / f"{image.stem}.txt"
        if label.is_file():
            shutil.copy(label, out_labels / label.name)
    return out_images


def synthetic_dataset(root: Path, n: int, seed: int = 0) -> Path:
    """``n`` small JPEGs (64 distinct pictures under distinct names) with labels of COCO's density."""
    rng = np.random.default_rng(seed)
    images, labels = root / "images" / "train", root / "labels" / "train"
    images.mkdir(parents=True), labels.mkdir(parents=True)
    w, h = SMALL_JPEG
    y, x = np.mgrid[0:h, 0:w]
    pictures = []
    for _ in range(64):
        f = rng.uniform(0.02, 0.2, 3)
        im = np.stack([127 + 100 * np.sin(x * f[0] + y * f[1] + k * f[2]) for k in range(3)], 2).astype(np.uint8)
        pictures.append(cv2.imencode(".jpg", im, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes())
    counts = rng.poisson(BOXES_PER_IMAGE, n)
    for i in range(n):
        (images / f"{i:06d}.jpg").write_bytes(pictures[i % len(pictures)])
        wh = rng.uniform(0.05, 0.5, (counts[i], 2))
        centre = rng.uniform(wh / 2, 1 - wh / 2)
        rows = [f"{c} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}"
                for c, (cx, cy), (bw, bh) in zip(rng.integers(0, 80, counts[i]), centre, wh)]
        (labels / f"{i:06d}.txt").write_text("".join(row + "\n" for row in rows))
    return images


def _status_mb(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process in MB. Not ``ru_maxrss``: Linux keeps that across
    ``exec``, so a child would report its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(tool: str, images: Path) -> dict:
    """In this (fresh) process: build ``tool``'s training dataset of ``images``, time it, measure its memory."""
    warnings.simplefilter("ignore")
    if tool == "reference":
        from yolov5.utils.dataloaders import LoadImagesAndLabels
    else:
        from yolotrain.data.dataset import DetectionDataset
        from yolotrain.data.sources import list_images
        from yolotrain.data.verify import verify_split
    # The first full garbage collection after importing torch walks every object the imports made (about 0.1 s):
    # done here, it is not billed to whichever tool's start-up happens to allocate enough to trigger it.
    gc.collect()
    base = _status_mb("VmRSS")
    wall, cpu = time.perf_counter(), time.process_time()
    if tool == "reference":
        dataset = LoadImagesAndLabels(str(images), 640, 16)
        n = len(dataset)
    else:
        index = verify_split(list_images(images), 80)
        n = len(DetectionDataset(index, 640, 16))
    wall = time.perf_counter() - wall
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu + children.ru_utime + children.ru_stime
    peak = _status_mb("VmHWM")
    return {"images": n, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "rss_growth_mb": round(peak - base, 1)}


def _cache_size(tool: str, images: Path) -> int:
    labels = images.parent.parent / "labels"
    name = f"{images.name}.cache" if tool == "reference" else f"{images.name}.yolotrain.cache"
    return (labels / name).stat().st_size


def dataset_rows(sizes: list[int], tmp: Path) -> list[dict]:
    rows = []
    for n in sizes:
        started = time.perf_counter()
        images = synthetic_dataset(tmp / f"synthetic-{n}", n)
        generated = time.perf_counter() - started
        row: dict = {"images": n, "generated_s": round(generated, 1)}
        for tool in ("reference", "yolotrain"):
            for phase in ("first", "cached"):
                out = subprocess.run([sys.executable, __file__, "--child", tool, str(images)], check=True,
                                     capture_output=True, text=True, env=os.environ).stdout
                row[f"{tool}_{phase}"] = json.loads(out.strip().splitlines()[-1])
            row[f"{tool}_cache_bytes"] = _cache_size(tool, images)
            peak = max(row[f"{tool}_first"]["rss_growth_mb"], row[f"{tool}_cached"]["rss_growth_mb"])
            row[f"{tool}_rss_kb_per_image"] = round(peak * 1024 / n, 2)
        for phase in ("first", "cached"):
            ref_s, ours_s = row[f"reference_{phase}"]["wall_s"], row[f"yolotrain_{phase}"]["wall_s"]
            # A tiny split's start-up can round to 0.00 s: no ratio then.
            row[f"speedup_{phase}"] = round(ref_s / ours_s, 2) if ours_s > 0 else None
        print(json.dumps(row), flush=True)
        rows.append(row)
        shutil.rmtree(images.parent.parent, ignore_errors=True)
    return rows


class ToFloat:
    """A reference loader whose uint8 batches are made float 0..1 as its ``train.py`` does before the model
    (``imgs.float() / 255``): what our loader hands over, so the two deliver the same."""

    def __init__(self, loader) -> None:
        self.loader, self.dataset = loader, loader.dataset

    def __iter__(self):
        for imgs, *rest in self.loader:
            yield imgs.float() / 255, *rest


def _epoch(loader, epoch: int) -> tuple[int, float, float]:
    """Images, wall seconds and CPU seconds (this process: workers 0) of one epoch of ``loader``."""
    if hasattr(loader.dataset, "set_epoch"):
        loader.dataset.set_epoch(epoch)
    wall, cpu, n = time.perf_counter(), time.process_time(), 0
    for imgs, *_ in loader:  # the reference's (imgs, targets, paths, shapes), ours a Batch of (imgs, targets)
        n += len(imgs)
    return n, time.perf_counter() - wall, time.process_time() - cpu


def _alternating(loaders: dict[str, object], rounds: int) -> dict[str, dict[str, float]]:
    """Each loader's best epoch over ``rounds`` rounds, the contenders taking turns within each round (after a
    warm-up epoch each): on a machine shared with other work the load changes between epochs, and the best epoch
    of each is the one least slowed by it."""
    for loader in loaders.values():
        _epoch(loader, 0)
    best: dict[str, dict[str, float]] = {}
    for r in range(1, rounds + 1):
        for key, loader in loaders.items():
            n, wall, cpu = _epoch(loader, r)
            rate = {"img_s": round(n / wall, 1), "img_per_core_s": round(n / cpu, 1),
                    "cores_used": round(cpu / wall, 2)}
            if key not in best or rate["img_s"] > best[key]["img_s"]:
                best[key] = rate
    return best


def loader_rows(datasets: dict[str, Path], rounds: int, img_size: int) -> list[dict]:
    import torch
    import yaml
    from torch.utils.data import DataLoader
    from yolov5.utils.dataloaders import LoadImagesAndLabels

    from yolotrain.data.augment import AugmentConfig
    from yolotrain.data.dataset import DetectionDataset
    from yolotrain.data.loaders import make_loader
    from yolotrain.data.sample_threads import default_sample_threads
    from yolotrain.data.sources import list_images
    from yolotrain.data.verify import verify_split

    torch.set_num_threads(1)  # one process, one core: neither side's collate spreads over threads
    hyp_path = Path(sys.modules["yolov5"].__file__).parent / "data" / "hyps" / "hyp.scratch-low.yaml"
    ref_hyp = yaml.safe_load(hyp_path.read_text())
    rows = []
    for name, images in datasets.items():
        index = verify_split(list_images(images), 80)
        long_side = int(np.median(np.asarray(index.shapes).reshape(-1, 2).max(1)))
        row: dict = {"data": name, "images": len(index.files), "median_long_side": long_side, "img_size": img_size,
                     "threads": default_sample_threads(0)}
        for cache in ("none", "ram"):
            ref_ds = LoadImagesAndLabels(str(images), img_size, 16, augment=True, hyp=ref_hyp,
                                         cache_images=cache == "ram" and "ram")
            ref_loader = DataLoader(ref_ds, batch_size=16, shuffle=True, num_workers=0,
                                    collate_fn=LoadImagesAndLabels.collate_fn)
            loaders = {f"reference_{cache}": ref_loader, f"reference_{cache}_float": ToFloat(ref_loader)}
            ours = {"none": {"cache_mb": 0}, "ram": {"cache": "ram"}}[cache]
            variants = {"": {"threads": default_sample_threads(0)}, "_one_thread": {"threads": 1}}
            if cache == "none":
                variants["_full_decode"] = {"threads": 1, "reduced_decode": False}
            for suffix, extra in variants.items():
                ds = DetectionDataset(index, img_size, 16, augment=True, hyp=AugmentConfig(), **ours, **extra)
                loaders[f"yolotrain_{cache}{suffix}"] = make_loader(ds, 16, True, 0)
            row.update(_alternating(loaders, rounds))
            del loaders, ref_ds
            for suffix in variants:
                ours_s, ref_s = row[f"yolotrain_{cache}{suffix}"], row[f"reference_{cache}"]
                row[f"ratio_{cache}{suffix}"] = round(ours_s["img_s"] / ref_s["img_s"], 2)
                row[f"ratio_{cache}{suffix}_per_core"] = round(ours_s["img_per_core_s"] / ref_s["img_per_core_s"], 2)
            ours_s, ref_s = row[f"yolotrain_{cache}_one_thread"], row[f"reference_{cache}_float"]
            row[f"ratio_{cache}_one_thread_vs_float"] = round(ours_s["img_s"] / ref_s["img_s"], 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def model_gflops(version: str, img_size: int) -> float:
    """GFLOPs (multiply-adds counted twice) of one square image's forward pass through our model."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from yolotrain import Yolov5

    model = Yolov5(version, num_classes=80).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, img_size, img_size))
    return counter.get_total_flops() / 1e9


def random_checkpoint(reference_root: Path, version: str, path: Path) -> Path:
    """The reference's ``yolov5{version}`` randomly initialised (seed 0), saved as an official checkpoint (which
    both tools' ``val`` read)."""
    import torch
    from bench_train import reference_yaml
    from yolov5.models.yolo import Model

    torch.manual_seed(0)
    model = Model(str(reference_yaml(reference_root, version)), nc=80)
    model.names, model.nc = {i: str(i) for i in range(80)}, 80
    torch.save({"model": model.half(), "ema": None, "epoch": -1}, path)
    return path


def _with_cpu_seconds(run):
    """``run`` returning ``(its result, process CPU seconds it took)``: val's passes run in this process (workers 0,
    ours on the loader's threads), so the process's CPU time is all of a pass's work."""
    def measured():
        cpu = time.process_time()
        result = run()
        return result, time.process_time() - cpu
    return measured


def model_rows(configs: list[str], parts: list[str], subset: int, rounds: int, epochs: int, tmp: Path,
               save) -> list[dict]:
    """One row per ``version@size`` of ``configs`` with the ``parts`` measured (``step``, ``val``, ``command``);
    each part runs over all rows before the next, and ``save(rows)`` is called after every measurement."""
    import bench_eval
    import bench_train
    import yolov5

    from yolotrain.data.sources import link_subset

    reference_root = Path(yolov5.__file__).parent
    os.environ.update(bench_train.reference_train_env(tmp / "reference-config"))
    data = link_subset(COCO128 / "data.yaml", tmp / "data", subset)
    rows = []
    for config in configs:
        version, size = config.split("@")
        rows.append({"model": f"yolov5{version}", "version": version, "img_size": int(size),
                     "gflops_per_image": round(model_gflops(version, int(size)), 2),
                     "weights": "official" if bench_train.model_source(version).endswith(".pt") else "random"})
    if "step" in parts:
        for row in rows:
            version, size = row["version"], row["img_size"]
            source = bench_train.model_source(version)
            contenders = {"ours": bench_train.our_step(source, data, size, tmp / "runs"),
                          "ours_fp32": bench_train.our_step(source, data, size, tmp / "runs", amp="off"),
                          "reference": bench_train.reference_step(reference_root, version, data, size)}
            load = os.getloadavg()[0]
            row["step"] = {**bench_train.time_alternating(contenders, rounds), "load_before": round(load, 1),
                           "load_after": round(os.getloadavg()[0], 1)}
            del contenders
            print(row["model"], size, json.dumps(row["step"]), flush=True)
            save(rows)
    if "val" in parts:
        reference_val = bench_eval.import_reference(str(tmp / "reference-config"))
        for row in rows:
            version, size = row["version"], row["img_size"]
            source = bench_train.model_source(version)
            weights = Path(source) if source.endswith(".pt") else random_checkpoint(
                reference_root, version, tmp / f"yolov5{version}-random.pt")
            contenders = bench_eval.val_contenders(weights, data, size, tmp / "val", reference_val)
            passes = bench_eval.alternating_passes({side: _with_cpu_seconds(run) for side, run in contenders.items()},
                                                   2)
            row["val"] = {side: {"best_s": round(min(t for t, _ in runs), 3),
                                 "passes_s": [round(t, 3) for t, _ in runs],
                                 "best_cpu_s": round(min(cpu for _, (_, cpu) in runs), 3),
                                 "passes_cpu_s": [round(cpu, 3) for _, (_, cpu) in runs]}
                          for side, runs in passes.items()}
            print(row["model"], size, json.dumps(row["val"]), flush=True)
            save(rows)
    if "command" in parts:
        for row in rows:
            version, size = row["version"], row["img_size"]
            runs = bench_train.end_to_end(version, size, data, tmp / f"command-{version}-{size}", reference_root,
                                          epochs, labels=("val",))["val"]
            row["command"] = {side: {"wall_s": round(r["wall_s"], 1), "cpu_s": round(r["cpu_s"], 1),
                                     "peak_rss_gb": round(r["peak_rss_gb"], 2)} for side, r in runs.items()}
            print(row["model"], size, json.dumps(row["command"]), flush=True)
            save(rows)
    return rows


def _model_reading(row: dict, rows: list[dict], batch: int) -> str:
    """How this row's cost compares with its FLOPs, with the same model's smaller size, and with the reference."""
    parts = []
    step = row.get("step")
    if step:  # CPU time: on a shared machine the wall clock of a step also counts the other work's turns
        ms_per_gflop = {side: step[side]["cpu_s"] * 1e3 / batch / row["gflops_per_image"]
                        for side in ("ours", "ours_fp32", "reference")}
        parts.append(f"step {ms_per_gflop['ours_fp32']:.1f} CPU ms per image-GFLOP in float32 "
                     f"(reference {ms_per_gflop['reference']:.1f}, ours default {ms_per_gflop['ours']:.1f})")
        # The same widths and depths at a smaller size (n6 at 1280 against n at 640: a P6 model is its P5 one
        # with one more output level).
        smaller = sorted((r for r in rows if r["version"].rstrip("6") == row["version"].rstrip("6")
                          and r["img_size"] < row["img_size"] and r.get("step")), key=lambda r: r["img_size"])
        if smaller:
            s = smaller[-1]
            cost = {side: step[side]["cpu_s"] / s["step"][side]["cpu_s"] for side in ("ours_fp32", "reference")}
            parts.append(f"x{row['gflops_per_image'] / s['gflops_per_image']:.1f} FLOPs over {s['model']} at "
                         f"{s['img_size']} px cost x{cost['ours_fp32']:.1f} CPU (float32), reference "
                         f"x{cost['reference']:.1f}")
        parts.append(f"step reference/ours in CPU time {step['reference']['cpu_s'] / step['ours']['cpu_s']:.2f}x "
                     f"(float32 {step['reference']['cpu_s'] / step['ours_fp32']['cpu_s']:.2f}x), wall "
                     f"{step['reference']['wall_s'] / step['ours']['wall_s']:.2f}x "
                     f"({step['reference']['wall_s'] / step['ours_fp32']['wall_s']:.2f}x)")
    if row.get("val"):  # val's passes run in this process, timed by bench_eval
        v = row["val"]
        parts.append(f"val reference/ours {v['reference']['best_s'] / v['ours']['best_s']:.2f}x float32, "
                     f"{v['reference']['best_s'] / v['ours_half']['best_s']:.2f}x bf16"
                     + (f", in CPU time {v['reference']['best_cpu_s'] / v['ours']['best_cpu_s']:.2f}x and "
                        f"{v['reference']['best_cpu_s'] / v['ours_half']['best_cpu_s']:.2f}x"
                        if "best_cpu_s" in v["ours"] else ""))
    if row.get("command"):
        c = row["command"]
        parts.append(f"command reference/ours {c['reference']['wall_s'] / c['ours']['wall_s']:.2f}x "
                     f"(float32 {c['reference']['wall_s'] / c['ours_fp32']['wall_s']:.2f}x), in CPU time "
                     f"{c['reference']['cpu_s'] / c['ours']['cpu_s']:.2f}x "
                     f"({c['reference']['cpu_s'] / c['ours_fp32']['cpu_s']:.2f}x)")
    for sample in row.get("command_samples", []):
        parts.append(f"command sample ({sample['first']} first, load {sample['load_before']}-{sample['load_after']}): "
                     + " / ".join(f"{sample[side]['wall_s']:.1f} s ({sample[side]['cpu_s']:.1f} CPU s)"
                                  for side in ("ours", "ours_fp32", "reference"))
                     + f" ours / float32 / reference, reference/ours float32 "
                     f"{sample['reference']['wall_s'] / sample['ours_fp32']['wall_s']:.2f}x")
    return "; ".join(parts)


def _markdown_models(report: dict) -> list[str]:
    setup = report["models_setup"]
    lines = ["## Model and image size: training step, val, whole 3-epoch command", "",
             f"Made by `{setup['command']}` on {report['cpu_model']} ({report['cpus']} CPUs, shared with other work: "
             f"load average {setup['load_before']} before, {setup['load_after']} after), torch {setup['torch']}. "
             f"Data: the first {setup['subset']} images of coco128 (train and val split alike). yolov5n from the "
             "official weights, s, m and n6 randomly initialised (same cost per step; val of a random model finds "
             "almost no boxes above conf 0.001, so its NMS costs next to nothing). Ours with the defaults "
             f"(`--amp auto`: {setup['auto_precision']} on this CPU; val `half` None: the same) and in float32; "
             "the reference (float32, its only CPU precision) in the same run, the contenders alternating.",
             "", f"- step: `bench_train` `Trainer.train_batch` vs the reference's model + ComputeLoss + SGD + EMA, "
             f"batch {setup['batch']} (one fixed mosaic batch), median of {setup['step_rounds']} alternating rounds "
             f"after a warm-up, torch threads: {setup['torch_threads']};",
             "- val: `bench_eval` `yolotrain.val(weights, data)` (float32, bf16) vs the reference's `val.run`, batch "
             "32, workers 0, best of 2 alternating passes;",
             f"- command: `bench_train` `yolotrain train --model M --data D --img S --epochs {setup['epochs']} "
             f"--batch-size {setup['batch']} --workers 2 --device cpu --noplots [--amp off]` vs the reference's "
             "`train.py` with the same arguments (`--weights yolov5n.pt` / `--weights '' --cfg yolov5X.yaml`), "
             "validation every epoch; wall seconds.", "",
             "| model | img | GFLOPs/img | step wall ms: ours / float32 / reference | step CPU ms: ours / float32 / "
             "reference | step ref/ours, CPU (float32) | "
             "val s: bf16 / float32 / reference | val ref/ours float32 (bf16) | command s: ours / float32 / "
             "reference | command ref/ours (float32) | peak RSS GB ours / reference |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in report["models"]:
        cells = [row["model"], str(row["img_size"]), f"{row['gflops_per_image']:.1f}"]
        st = row.get("step")
        cells += [f"{st['ours']['wall_s'] * 1e3:.0f} / {st['ours_fp32']['wall_s'] * 1e3:.0f} / "
                  f"{st['reference']['wall_s'] * 1e3:.0f}",
                  f"{st['ours']['cpu_s'] * 1e3:.0f} / {st['ours_fp32']['cpu_s'] * 1e3:.0f} / "
                  f"{st['reference']['cpu_s'] * 1e3:.0f}",
                  f"{st['reference']['cpu_s'] / st['ours']['cpu_s']:.2f}x "
                  f"({st['reference']['cpu_s'] / st['ours_fp32']['cpu_s']:.2f}x)"] if st else ["", "", ""]
        v = row.get("val")
        cpu = (f" ({v['ours_half']['best_cpu_s']:.2f} / {v['ours']['best_cpu_s']:.2f} / "
               f"{v['reference']['best_cpu_s']:.2f} CPU)") if v and "best_cpu_s" in v["ours"] else ""
        cells += [f"{v['ours_half']['best_s']:.2f} / {v['ours']['best_s']:.2f} / {v['reference']['best_s']:.2f}{cpu}",
                  f"{v['reference']['best_s'] / v['ours']['best_s']:.2f}x "
                  f"({v['reference']['best_s'] / v['ours_half']['best_s']:.2f}x)"] if v else ["", ""]
        c = row.get("command")
        cells += [f"{c['ours']['wall_s']:.1f} / {c['ours_fp32']['wall_s']:.1f} / {c['reference']['wall_s']:.1f}",
                  f"{c['reference']['wall_s'] / c['ours']['wall_s']:.2f}x "
                  f"({c['reference']['wall_s'] / c['ours_fp32']['wall_s']:.2f}x)",
                  f"{max(c['ours']['peak_rss_gb'], c['ours_fp32']['peak_rss_gb']):.2f} / "
                  f"{c['reference']['peak_rss_gb']:.2f}"] if c else ["", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    made = sorted({(part, row[f"{part}_made_by"]["command"], row[f"{part}_made_by"]["load_before"],
                    row[f"{part}_made_by"]["load_after"]) for row in report["models"] for part in ("step", "val",
                                                                                               "command")
                   if row.get(f"{part}_made_by")})
    lines += [line for part, cmd, before, after in made
              for line in ("", f"The {part} columns measured again by `{cmd}` (load average {before} before, "
                               f"{after} after).")]
    lines += ["", "Reading, row by row:", ""]
    lines += [f"- {row['model']} at {row['img_size']}: {_model_reading(row, report['models'], setup['batch'])}."
              for row in report["models"]]
    if setup.get("reading"):
        lines += ["", setup["reading"]]
    return lines + [""]


def markdown(report: dict) -> str:
    lines = ["# Scaling: how the cost grows with image size, dataset size and model size", ""]
    if report["loader"] or report["datasets"]:
        lines += [f"Made by `{report['command']}` on {report['cpu_model']} ({report['cpus']} CPUs, shared with "
                  f"other work: load average {report['load_before']} before, {report['load_after']} after), Python "
                  f"{report['python']}. Ours against the reference (PyPI yolov5 7.0.14) in the same run.", ""]
    if report["loader"]:
        made = report.get("loader_made_by")
        threads = report["loader"][0].get("threads", 1)
        lines += [f"## Loader at {report['loader'][0]['img_size']} px, one process (workers 0), mosaic on", ""]
        if made:
            lines += [f"Made by `{made['command']}` (load average {made['load_before']} before, {made['load_after']} "
                      f"after). Ours as `--workers 0` builds batches: a batch's samples on {threads} threads of the "
                      "process; then on one thread; then on one thread with reduced_decode off.", ""]
        lines += ["| data | median long side | cache | reference img/s | reference + float 0..1 | ours img/s | ratio "
                  "(per core) | ours, one thread | ratio one thread (per core) | one thread / reference + float | "
                  "ours, one thread, full decode | ratio full decode |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

        def cell(row: dict, key: str, field: str = "img_s") -> str:
            value = row.get(key)
            return "" if value is None else str(value[field] if field else value)

        for row in report["loader"]:
            for cache in ("none", "ram"):
                one = f"yolotrain_{cache}_one_thread"
                lines.append(
                    f"| {row['data']} ({row['images']} images) | {row['median_long_side']} | {cache} | "
                    f"{row[f'reference_{cache}']['img_s']} | {cell(row, f'reference_{cache}_float')} | "
                    f"{row[f'yolotrain_{cache}']['img_s']} | "
                    f"{row[f'ratio_{cache}']}x ({row[f'ratio_{cache}_per_core']}x) | {cell(row, one)} | "
                    + (f"{row[f'ratio_{cache}_one_thread']}x ({row[f'ratio_{cache}_one_thread_per_core']}x) | "
                       if one in row else " | ")
                    + (f"{row[f'ratio_{cache}_one_thread_vs_float']}x | " if f"reference_{cache}_float" in row
                       else " | ")
                    + f"{cell(row, f'yolotrain_{cache}_full_decode')} | "
                    + (f"{row[f'ratio_{cache}_full_decode']}x |" if f"ratio_{cache}_full_decode" in row else " |"))
        lines += ["", report["loader_reading"], ""]
    if report["datasets"]:
        lines += ["## Dataset size: verification, start-up from the cache, memory", "",
                  "| images | tool | first run s (CPU s) | cached start-up s (CPU s) | peak RSS growth MB | "
                  "RSS KB per image | cache file KB |", "|---:|---|---:|---:|---:|---:|---:|"]
        for row in report["datasets"]:
            for tool in ("reference", "yolotrain"):
                first, cached = row[f"{tool}_first"], row[f"{tool}_cached"]
                peak = max(first["rss_growth_mb"], cached["rss_growth_mb"])
                lines.append(f"| {row['images']} | {tool} | {first['wall_s']} ({first['cpu_s']}) | "
                             f"{cached['wall_s']} ({cached['cpu_s']}) | {peak} | "
                             f"{row[f'{tool}_rss_kb_per_image']} | {row[f'{tool}_cache_bytes'] // 1024} |")
        lines += ["", report["datasets_reading"], ""]
        lines += [f"The {row['images']}-image rows: made by `{row['made_by']['command']}` (load average "
                  f"{row['made_by']['load_before']} before, {row['made_by']['load_after']} after)."
                  for row in report["datasets"] if row.get("made_by")]
        if any(row.get("made_by") for row in report["datasets"]):
            lines.append("")
    if report.get("models"):
        lines += _markdown_models(report)
    return "\n".join(lines)


def _reading_loader(rows: list[dict]) -> str:
    parts = [f"{row['data']} (median long side {row['median_long_side']} px): without a cache ours "
             f"{row['ratio_none']}x the reference ({row['ratio_none_per_core']}x per core; on one thread "
             f"{row['ratio_none_one_thread']}x, {row['ratio_none_full_decode']}x with reduced_decode off too), "
             f"RAM cache {row['ratio_ram']}x ({row['ratio_ram_per_core']}x per core; one thread "
             f"{row['ratio_ram_one_thread']}x, and {row['ratio_ram_one_thread_vs_float']}x the reference's loader "
             f"with the float conversion its trainer does)"
             for row in rows]
    return ("Reading: " + "; ".join(parts) + ". Without a cache both sides' cost grows with the size of the files: "
            "decoding at reduced scale skips most of the inverse DCT, colour conversion and resizing, but not the "
            "entropy decoding of every coefficient, which bounds one thread at about twice the reference's speed; "
            "decoding releases the GIL, so the samples of a batch built on threads spread it over the cores. With "
            "the RAM cache the cost does not depend on the files; ours then spends about a third of a sample's time "
            "making the batch float32 0..1, which the reference leaves to its trainer (column reference + float 0..1).")


def _reading_datasets(rows: list[dict]) -> str:
    if not rows:
        return ""
    first, last = rows[0], rows[-1]

    def per_image_ms(row: dict, tool: str, phase: str) -> float:
        return round(row[f"{tool}_{phase}"]["cpu_s"] / row["images"] * 1e3, 3)

    costs = "; ".join(f"{tool}: first run {per_image_ms(first, tool, 'first')} -> {per_image_ms(last, tool, 'first')}, "
                      f"cached start-up {per_image_ms(first, tool, 'cached')} -> {per_image_ms(last, tool, 'cached')}"
                      for tool in ("yolotrain", "reference"))
    return (f"Reading: CPU ms per image from {first['images']} to {last['images']} images, {costs}. At "
            f"{last['images']} images ours takes {last['speedup_first']}x the reference's speed on the first run and "
            f"{last['speedup_cached']}x on the cached start-up (wall clock), and holds "
            f"{last['yolotrain_rss_kb_per_image']} KB per image against {last['reference_rss_kb_per_image']} KB.")


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(COCO128))
    p.add_argument("--images", type=int, default=64, help="the first N images of coco128 (both resolutions)")
    p.add_argument("--rounds", type=int, default=3, help="timed epochs of each loader, taking turns")
    p.add_argument("--img-size", type=int, default=640)
    p.add_argument("--dataset-sizes", type=int, nargs="*", default=[1000, 10000])
    p.add_argument("--no-loader", action="store_true",
                   help="dataset-size rows only; the other rows of scaling.json are kept (those of other sizes too)")
    p.add_argument("--no-datasets", action="store_true",
                   help="loader rows only; the dataset-size and model-size rows already in scaling.json are kept")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--models", default="", help="model-size rows instead: comma list of version@size")
    p.add_argument("--parts", nargs="*", default=["step", "val", "command"], help="what the model-size rows measure")
    p.add_argument("--subset", type=int, default=16, help="coco128 images of the model-size rows")
    p.add_argument("--step-rounds", type=int, default=3, help="timed training steps per contender")
    p.add_argument("--epochs", type=int, default=3, help="epochs of the whole commands")
    p.add_argument("--batch", type=int, default=16, help="batch size of the model-size steps and commands")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads of the in-process steps and val (0: PyTorch's default)")
    p.add_argument("--add-command-sample", action="store_true",
                   help="with --models: run the whole command of those rows (already in scaling.json) once more and "
                        "add it to the row's command_samples, keeping every other measurement")
    p.add_argument("--first", choices=("ours", "ours_fp32", "reference"),
                   help="with --add-command-sample: the side that runs first (default: the rotation's)")
    p.add_argument("--child", nargs=2, metavar=("TOOL", "IMAGES"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child[0], Path(a.child[1]))))
        return None
    if a.models and a.add_command_sample:
        return add_command_samples(a)
    if a.models:
        return add_model_rows(a, argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    load_before = os.getloadavg()[0]
    try:
        os.environ.update(reference_env(tmp / "config"))
        os.environ["YOLOTRAIN_CACHE"] = str(tmp / "cache")
        warnings.simplefilter("ignore")
        loader: list[dict] = []
        if not a.no_loader:
            images = copy_images(a.data, tmp / "coco128", a.images)
            big = upscaled_copy(images, tmp / "coco128-4x")
            loader = loader_rows({"coco128": images, f"coco128 upscaled {UPSCALE}x": big}, a.rounds, a.img_size)
        datasets = [] if a.no_datasets else dataset_rows(a.dataset_sizes, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    import torch

    report = {
        "what": "data-path cost as images and datasets grow, ours and the reference's in the same run",
        "command": "python benchmarks/bench_scaling.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "opencv": cv2.__version__,
        "rounds": a.rounds,
        "timing": "each loader's best of the timed epochs, the contenders taking turns; per core = images per CPU "
                  "second of the process (workers 0, torch and OpenCV as each side sets them, torch at 1 thread)",
        "loader": loader,
        "loader_reading": _reading_loader(loader) if loader else "",
        "datasets": datasets,
        "datasets_reading": _reading_datasets(datasets),
    }
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    previous = json.loads((out / "scaling.json").read_text()) if (out / "scaling.json").is_file() else None
    made_by = {key: report[key] for key in ("command", "load_before", "load_after", "rounds")}
    if a.no_datasets and previous:
        # The report's own command and load describe the dataset-size rows it keeps; the loader rows get theirs.
        report = {**previous, "loader": report["loader"], "loader_reading": report["loader_reading"],
                  "loader_made_by": made_by}
    elif a.no_loader and previous:
        # Rows of the sizes measured now replace the old ones, each saying how it was made; the rest are kept.
        measured = {row["images"] for row in datasets}
        for row in datasets:
            row["made_by"] = made_by
        rows = sorted([row for row in previous.get("datasets", []) if row["images"] not in measured] + datasets,
                      key=lambda row: row["images"])
        report = {**previous, "datasets": rows, "datasets_reading": _reading_datasets(rows)}
    (out / "scaling.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "scaling.md").write_text(markdown(report) + "\n")
    return report


def add_model_rows(a: argparse.Namespace, argv: list[str] | None) -> dict:
    """Measure the model-size rows into ``scaling.json``/``.md`` under ``a.out_dir``, keeping the rows already
    there; both files are rewritten after every measurement, so an interrupted run keeps what it measured."""
    import bench_train
    import torch

    from yolotrain.engine.prepare import autocast_dtype

    bench_train.BATCH = a.batch  # bench_train's steps and commands read it when they run
    if a.threads:
        torch.set_num_threads(a.threads)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "scaling.json"
    report = json.loads(path.read_text()) if path.is_file() else {
        "cpus": os.cpu_count(), "cpu_model": cpu_model(), "loader": [], "datasets": []}
    command = "python benchmarks/bench_scaling.py " + " ".join(sys.argv[1:] if argv is None else argv)
    load_before = round(os.getloadavg()[0], 1)
    earlier = {(row["model"], row["img_size"]): row for row in report.get("models", [])}
    every_part = set(a.parts) >= {"step", "val", "command"}
    if every_part or "models_setup" not in report:
        report["models_setup"] = {
            "command": command, "load_before": load_before, "subset": a.subset, "step_rounds": a.step_rounds,
            "epochs": a.epochs, "batch": a.batch, "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "auto_precision": "bf16" if autocast_dtype("auto", torch.device("cpu")) else "float32",
            "reading": report.get("models_setup", {}).get("reading", "")}

    def merged(row: dict) -> dict:
        """A row measured now for some of the parts, laid over the same model's earlier row (its other parts kept),
        each part measured now saying how."""
        if every_part:
            return row
        made_by = {"command": command, "load_before": load_before, "load_after": round(os.getloadavg()[0], 1)}
        return {**earlier.get((row["model"], row["img_size"]), {}), **row,
                **{f"{part}_made_by": made_by for part in a.parts if part in row}}

    def save(rows: list[dict]) -> None:
        now = {(row["model"], row["img_size"]): merged(row) for row in rows}
        report["models"] = [now.pop((row["model"], row["img_size"]), row) for row in report.get("models", [])
                            if not every_part] + list(now.values())
        report["models_setup"]["load_after"] = round(os.getloadavg()[0], 1)
        path.write_text(json.dumps(report, indent=2) + "\n")
        (out / "scaling.md").write_text(markdown(report) + "\n")

    tmp = Path(tempfile.mkdtemp(prefix="bench-scaling-models-"))
    try:
        warnings.simplefilter("ignore")
        save(model_rows(a.models.split(","), a.parts, a.subset, a.step_rounds, a.epochs, tmp, save))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def add_command_samples(a: argparse.Namespace) -> dict:
    """One more sample of the whole command of each ``a.models`` row of ``scaling.json`` under ``a.out_dir``,
    appended to the row's ``command_samples`` (with the load before and after it, the side that ran first and how
    each command waited: see ``bench_train.run_command``); the rest of the report is kept as it is."""
    import bench_train
    import yolov5

    from yolotrain.data.sources import link_subset

    path = Path(a.out_dir) / "scaling.json"
    report = json.loads(path.read_text())
    rows = {f"{row['version']}@{row['img_size']}": row for row in report.get("models", [])}
    missing = [config for config in a.models.split(",") if config not in rows]
    if missing:
        sys.exit(f"no model rows {', '.join(missing)} in {path}: measure them first (--models without "
                 "--add-command-sample)")
    bench_train.BATCH = a.batch
    tmp = Path(tempfile.mkdtemp(prefix="bench-scaling-command-"))
    try:
        warnings.simplefilter("ignore")
        os.environ.update(bench_train.reference_train_env(tmp / "reference-config"))
        data = link_subset(COCO128 / "data.yaml", tmp / "data", a.subset)
        for config in a.models.split(","):
            version, size = config.split("@")
            load = os.getloadavg()[0]
            runs = bench_train.end_to_end(version, int(size), data, tmp / f"command-{version}-{size}",
                                          Path(yolov5.__file__).parent, a.epochs, labels=("val",), first=a.first)
            sample = {"load_before": round(load, 1), "load_after": round(os.getloadavg()[0], 1),
                      "first": a.first or "ours_fp32", "subset": a.subset, "epochs": a.epochs, "batch": a.batch,
                      **{side: {"wall_s": round(r["wall_s"], 1), "cpu_s": round(r["cpu_s"], 1),
                                "peak_rss_gb": round(r["peak_rss_gb"], 2),
                                **{k: r[k] for k in ("voluntary_switches", "involuntary_switches", "major_faults")}}
                         for side, r in runs["val"].items()}}
            rows[config].setdefault("command_samples", []).append(sample)
            print(config, json.dumps(sample), flush=True)
            path.write_text(json.dumps(report, indent=2) + "\n")
            (Path(a.out_dir) / "scaling.md").write_text(markdown(report) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


if __name__ == "__main__":
    main()
