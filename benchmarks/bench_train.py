"""Training speed against the reference, side by side in one run: the step, the epoch, the whole command.

For each model × image size it measures, on the same fixed mosaic batch of coco128 (batch 16):

- **floor**: our model's forward + backward alone (float32, the default NCHW layout, a plain sum as loss);
- **ours**: the trainer's real step (``Trainer.train_batch``: targets, loss, backward, clipping,
  optimiser, EMA; one optimiser step per batch) with the default settings (``--amp auto``: bf16 on CPUs
  with native bf16, float32 elsewhere; the setup block records which), and in float32 (``--amp off``);
- **reference**: the ``yolov5`` 7.0.14 package's model, ``ComputeLoss``, ``smart_optimizer`` groups,
  gradient clipping and ``ModelEMA``, in the order its ``train.py`` runs them;

alternating the contenders in every round so that machine drift falls on all of them alike, and
reporting each one's median. Then, for the end-to-end rows, whole commands in subprocesses
(mosaic on, 2 loader workers, same data and weights): ``yolotrain train`` (default, and ``--amp off``)
against the reference's ``train.py``, each run for 3 epochs with ``--noval`` (validation after the
last epoch only; the steady-state epoch is the time between the first and second rows of its
``results.csv``) and for 3 epochs validating every epoch (the whole short fine-tuning command).
Wall and CPU time come from ``wait4``, the peak RSS of each command's main process from ``/proc``.

    python benchmarks/bench_train.py                       # the full table (about half an hour on 2 cores)
    python benchmarks/bench_train.py --smoke               # tiny sizes, one round: checks the script runs

Writes ``benchmarks/results/train.json`` and ``train.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import COCO128, ROOT, alias_numpy_trapz, cpu_model, reference_env
from common import WEIGHTS_DIR as WEIGHTS

from yolotrain.data.batch import Batch
from yolotrain.data.sources import link_subset
from yolotrain.engine.prepare import autocast_dtype

BATCH = 16
# Runs the reference's train.py as a program, with numpy 2's name for the function it calls, and with
# the one line that makes its packaged 7.0.14 crash after a --noval epoch (it logs ``map50s``, which
# only validation defines) reading the per-class zeros it already logs as ``maps`` instead. Nothing
# else in it changes.
REFERENCE_TRAIN = (
    "import sys, numpy as np; np.trapz = np.trapezoid; path = sys.argv[1]; sys.argv = sys.argv[1:]; "
    "code = open(path).read(); line = 'list(maps) + list(map50s)'; "
    "assert line in code, 'the reference train.py changed: ' + line + ' not found'; "
    "code = code.replace(line, 'list(maps) + list(locals().get(\"map50s\", maps))'); "
    "exec(compile(code, path, 'exec'), {'__name__': '__main__', '__file__': path})")


def reference_train_env(config_dir: Path) -> dict[str, str]:
    """The environment of the reference's ``train.py``: offline (see :func:`common.reference_env`).

    It downloads Arial fonts into ``config_dir`` before training; matplotlib's DejaVu Sans stands in
    for them, so nothing is downloaded."""
    import matplotlib

    config_dir.mkdir(parents=True, exist_ok=True)
    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    for name in ("Arial.ttf", "Arial.Unicode.ttf"):
        if not (config_dir / name).exists():
            shutil.copyfile(font, config_dir / name)
    return {**os.environ, **reference_env(config_dir)}


def model_source(version: str) -> str:
    """The official weights when they are on disk (fine-tuning), else the architecture (from scratch)."""
    path = WEIGHTS / f"yolov5{version}.pt"
    return str(path) if path.is_file() else f"yolov5{version}"


def fixed_batch(data: Path, img_size: int) -> Batch:
    """The first mosaic batch of the training split, as the trainer's loader makes it."""
    from yolotrain.data.augment import AugmentConfig
    from yolotrain.data.loaders import DataConfig, build_loaders

    config = DataConfig(path=str(data), img_size=img_size, batch_size=BATCH, workers=0)
    loaders = build_loaders(config, AugmentConfig(), seed=0, splits=("train",), require_names=True)
    return next(iter(loaders.train))


def floor_step(version: str, imgs: torch.Tensor) -> Callable[[], None]:
    """Forward + backward of our model alone: what no training step can undercut in eager float32."""
    from yolotrain import Yolov5

    model = Yolov5(version, num_classes=80).train()

    def step() -> None:
        sum(m.sum() for m in model(imgs)).backward()
        model.zero_grad(set_to_none=True)

    return step


def our_step(source: str, data: Path, img_size: int, project: Path, **settings) -> Callable[[], None]:
    """The trainer's own iteration (``Trainer.train_batch``) with an optimiser and EMA update every batch."""
    from yolotrain.engine.config import resolve_config
    from yolotrain.engine.trainer import Trainer

    config = resolve_config(None, data=str(data), model=source, img_size=img_size, batch_size=BATCH, workers=0,
                            autoanchor=False, tensorboard=False, project=str(project), device="cpu", **settings)
    trainer = Trainer(config)
    trainer.setup()
    trainer.ddp.train()
    trainer.accumulate = 1
    batch = fixed_batch(data, img_size)
    counter = iter(range(1, 1 << 30))

    def step() -> None:
        trainer.train_batch(batch, epoch=0, index=0, step=next(counter))

    return step


def reference_yaml(reference_root: Path, version: str) -> Path:
    """The reference's architecture YAML of ``yolov5{version}``: P5 models in ``models/``, P6 in ``models/hub/``."""
    path = reference_root / "models" / f"yolov5{version}.yaml"
    return path if path.is_file() else reference_root / "models" / "hub" / f"yolov5{version}.yaml"


def reference_step(reference_root: Path, version: str, data: Path, img_size: int) -> Callable[[], None]:
    """The reference's iteration, as its train.py runs it on the CPU (no AMP), every batch an optimiser step."""
    import yaml
    from yolov5.models.yolo import Model
    from yolov5.utils.loss import ComputeLoss
    from yolov5.utils.torch_utils import ModelEMA, smart_optimizer

    model = Model(str(reference_yaml(reference_root, version)), nc=80)
    if (WEIGHTS / f"yolov5{version}.pt").is_file():
        from yolotrain.interop import load_model

        model.load_state_dict(load_model(WEIGHTS / f"yolov5{version}.pt").state_dict())
    hyp = yaml.safe_load((reference_root / "data" / "hyps" / "hyp.scratch-low.yaml").read_text())
    nl = model.model[-1].nl
    hyp["box"] *= 3 / nl
    hyp["obj"] *= (img_size / 640) ** 2 * 3 / nl
    hyp["label_smoothing"] = 0.0
    model.nc, model.hyp = 80, hyp
    model.train()
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"] * BATCH * 4 / 64)
    ema = ModelEMA(model)
    compute_loss = ComputeLoss(model)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    imgs, targets = fixed_batch(data, img_size)

    def step() -> None:
        with torch.autocast("cpu", enabled=False):
            loss, _ = compute_loss(model(imgs), targets)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        ema.update(model)

    return step


def time_alternating(steps: dict[str, Callable[[], None]], rounds: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds per call of each step; one warm-up call each, then the order of the
    contenders rotates every round."""
    for step in steps.values():
        step()
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            w, c = time.perf_counter(), time.process_time()
            steps[name]()
            wall[name].append(time.perf_counter() - w)
            cpu[name].append(time.process_time() - c)
    return {name: {"wall_s": statistics.median(wall[name]), "cpu_s": statistics.median(cpu[name]),
                   "rounds": rounds} for name in names}


def profile_steps(steps: dict[str, Callable[[], None]], rows: int = 15) -> str:
    """torch.profiler's table of the operators where each step spends its CPU time (after a warm-up call)."""
    from torch.profiler import ProfilerActivity, profile

    sections = []
    for name, step in steps.items():
        step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=48)
        sections.append(f"## {name}\n\n```\n{table}```\n")
    return "\n".join(sections)


def run_command(argv: list[str], env: dict[str, str], cwd: Path, results_csv: Path) -> dict[str, float | list[float]]:
    """Wall and CPU seconds (workers included), the peak RSS of its main process (GB) and the seconds at
    which each epoch's row appeared in its ``results.csv`` (both trainers write one per epoch).

    The peak is the kernel's high-water mark of the process (``VmHWM``), read while it runs:
    ``wait4``'s ``ru_maxrss`` would also count this process's own memory, which the child inherits
    at ``fork``."""
    started = time.perf_counter()
    rows_at: list[float] = []
    peak_kb = 0
    with open(cwd / "log.txt", "ab") as log:
        process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        while True:
            peak_kb = max(peak_kb, _high_water_kb(process.pid))
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            rows = results_csv.read_text().count("\n") - 1 if results_csv.is_file() else 0
            rows_at += [time.perf_counter() - started] * max(rows - len(rows_at), 0)
            if pid:
                break
            time.sleep(0.1)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"failed ({os.waitstatus_to_exitcode(status)}): {' '.join(argv)}; see {cwd / 'log.txt'}")
    # How the command waited: voluntary switches are waits it chose (a queue, a lock, the disk), involuntary
    # ones are turns it lost to other runnable work; major faults are pages (libraries, data) read from disk.
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_gb": peak_kb / 2**20,
            "epoch_rows_at_s": rows_at, "voluntary_switches": usage.ru_nvcsw,
            "involuntary_switches": usage.ru_nivcsw, "major_faults": usage.ru_majflt}


def _high_water_kb(pid: int) -> int:
    """``VmHWM`` of a running process in KiB (0 once it has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)


def end_to_end(version: str, img_size: int, data: Path, work: Path, reference_root: Path,
               epochs: int, labels: tuple[str, ...] = ("noval", "val"),
               first: str | None = None) -> dict[str, dict[str, dict]]:
    """``{"noval"|"val": {side: measurement}}``: each side's ``epochs``-epoch fine-tuning command with
    validation only after the last epoch (its second epoch is the steady-state one) and with
    validation after every epoch (the whole command), the order of the sides rotating; ``labels``
    picks which of the two run, ``first`` which side starts (default: the rotation's)."""
    source = model_source(version)
    env = reference_train_env(work / "reference-config")
    weights = ["--weights", source] if source.endswith(".pt") else ["--weights", "", "--cfg", f"yolov5{version}.yaml"]
    runs: dict[str, dict[str, dict]] = {}
    for label in labels:
        runs[label] = {}
        sides = ("ours", "ours_fp32", "reference")
        shift = sides.index(first) if first else len(runs) % len(sides)
        for side in sides[shift:] + sides[:shift]:
            name = f"{version}{img_size}-{side}-{label}"
            # No plots on either side: the reference's plotting needs a Pillow older than this one.
            common = ["--data", str(data), "--img", str(img_size), "--workers", "2", "--epochs", str(epochs),
                      "--batch-size", str(BATCH), "--device", "cpu", "--exist-ok", "--name", name, "--noplots"] + \
                (["--noval"] if label == "noval" else [])
            if side == "reference":
                project = work / "reference"
                argv = [sys.executable, "-c", REFERENCE_TRAIN, str(reference_root / "train.py"), *weights,
                        "--project", str(project), *common]
            else:
                project = work / "ours"
                argv = [sys.executable, "-m", "yolotrain", "train", "--model", source, "--project", str(project),
                        *common, *(["--amp", "off"] if side == "ours_fp32" else [])]
            runs[label][side] = run_command(argv, env, work, project / name / "results.csv")
    return runs


def summarise(setup: dict, steps: dict, e2e: dict, epochs: int) -> tuple[dict, str]:
    """Ratios and the Markdown table from the raw measurements."""
    rows, table = [], ["| model | img | floor ms | ours ms | ours/floor | ours float32 ms | reference ms | "
                       "reference/floor | step speed-up | float32 step speed-up |", "|---" * 10 + "|"]
    for key, s in steps.items():
        floor, ours, fp32, ref = (s[n]["wall_s"] for n in ("floor", "ours", "ours_fp32", "reference"))
        row = {"config": key, "floor_ms": floor * 1e3, "ours_ms": ours * 1e3, "ours_fp32_ms": fp32 * 1e3,
               "reference_ms": ref * 1e3, "ours_over_floor": ours / floor, "reference_over_floor": ref / floor,
               "step_speedup": ref / ours, "fp32_step_speedup": ref / fp32,
               "images_per_s": {"ours": BATCH / ours, "ours_fp32": BATCH / fp32, "reference": BATCH / ref}}
        rows.append(row)
        model, img = key.split("@")
        table.append(f"| {model} | {img} | {floor * 1e3:.0f} | {ours * 1e3:.0f} | {ours / floor:.3f} | "
                     f"{fp32 * 1e3:.0f} | {ref * 1e3:.0f} | {ref / floor:.3f} | {ref / ours:.2f}x | "
                     f"{ref / fp32:.2f}x |")
    e2e_rows = []
    if e2e:
        table += ["", f"| model | img | steady epoch s: ours / float32 / reference | speed-up (float32) | {epochs} "
                  "epochs with val s: ours / float32 / reference | speed-up (float32) | CPU s: ours / reference | "
                  "peak RSS GB: ours / reference |", "|---|---|---|---|---|---|---|---|"]
    for key, runs in e2e.items():
        noval, full = runs["noval"], runs["val"]
        # The second epoch: workers up, caches warm, no validation, one checkpoint save (both sides).
        epoch = {side: r["epoch_rows_at_s"][1] - r["epoch_rows_at_s"][0] for side, r in noval.items()}
        command = {side: r["wall_s"] for side, r in full.items()}
        row = {"config": key, "steady_epoch_s": epoch,
               "steady_epoch_speedup": epoch["reference"] / epoch["ours"],
               "steady_epoch_speedup_fp32": epoch["reference"] / epoch["ours_fp32"],
               "command_s": command, "command_speedup": command["reference"] / command["ours"],
               "command_speedup_fp32": command["reference"] / command["ours_fp32"],
               "command_cpu_s": {side: r["cpu_s"] for side, r in full.items()},
               "peak_rss_gb": {side: max(runs[k][side]["peak_rss_gb"] for k in runs) for side in full},
               "runs": runs}
        e2e_rows.append(row)
        model, img = key.split("@")
        cpu, rss = row["command_cpu_s"], row["peak_rss_gb"]
        table.append(
            f"| {model} | {img} | {epoch['ours']:.1f} / {epoch['ours_fp32']:.1f} / {epoch['reference']:.1f} | "
            f"{row['steady_epoch_speedup']:.2f}x ({row['steady_epoch_speedup_fp32']:.2f}x) | "
            f"{command['ours']:.1f} / {command['ours_fp32']:.1f} / {command['reference']:.1f} | "
            f"{row['command_speedup']:.2f}x ({row['command_speedup_fp32']:.2f}x) | "
            f"{cpu['ours']:.0f} / {cpu['reference']:.0f} | {rss['ours']:.2f} / {rss['reference']:.2f} |")
    result = {"setup": setup, "steps": rows, "end_to_end": e2e_rows, "raw_steps": steps}
    return result, "\n".join(table) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="n,s", help="comma list of versions for the step rows")
    p.add_argument("--sizes", default="320,640", help="comma list of image sizes for the step rows")
    p.add_argument("--rounds", type=int, default=5, help="timed steps per contender")
    p.add_argument("--e2e", default="n@320,n@640,s@320", help="model@size rows for whole commands ('' for none)")
    p.add_argument("--epochs", type=int, default=3, help="epochs of the longer commands")
    p.add_argument("--images", type=int, default=128, help="coco128 images used (the train and val split)")
    p.add_argument("--threads", type=int, default=0, help="torch threads for the step rows (0: PyTorch's default)")
    p.add_argument("--profile", default="", help="model@size whose steps are profiled into train_profile.md")
    p.add_argument("--smoke", action="store_true",
                   help="tiny run: n at 64 px, 2 rounds, 16 images, profiled, no commands")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="folder for train.json/.md")
    a = p.parse_args()
    if a.smoke:
        a.models, a.sizes, a.rounds, a.e2e, a.images, a.profile = "n", "64", 2, "", 16, "n@64"
    if not COCO128.is_dir():
        sys.exit(f"needs {COCO128}")
    import importlib.util

    if importlib.util.find_spec("yolov5") is None:
        sys.exit("needs the reference package: pip install '.[parity]'")
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    os.environ.update(reference_train_env(work / "reference-config"))
    alias_numpy_trapz()
    import yolov5

    reference_root = Path(yolov5.__file__).parent
    data = link_subset(COCO128 / "data.yaml", work / "data", a.images)
    setup = {"device": "cpu", "batch_size": BATCH, "images": a.images,
             "cpu": cpu_model(),
             "auto_precision": "bf16" if autocast_dtype("auto", torch.device("cpu")) else "fp32",
             "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
             "load_average_1min_at_start": os.getloadavg()[0], "rounds": a.rounds, "epochs": a.epochs}
    steps = {}
    for version in a.models.split(","):
        for size in (int(s) for s in a.sizes.split(",")):
            imgs, _ = fixed_batch(data, size)
            contenders = {
                "floor": floor_step(version, imgs),
                "ours": our_step(model_source(version), data, size, work / "runs"),
                "ours_fp32": our_step(model_source(version), data, size, work / "runs", amp="off"),
                "reference": reference_step(reference_root, version, data, size),
            }
            steps[f"yolov5{version}@{size}"] = time_alternating(contenders, a.rounds)
            print(f"yolov5{version}@{size}", json.dumps(steps[f"yolov5{version}@{size}"]), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.profile:
        version, size = a.profile.split("@")
        profiled = {"ours": our_step(model_source(version), data, int(size), work / "runs"),
                    "ours_fp32": our_step(model_source(version), data, int(size), work / "runs", amp="off"),
                    "reference": reference_step(reference_root, version, data, int(size))}
        (out / "train_profile.md").write_text(f"# Where the training step spends its time: yolov5{version} at "
                                              f"{size}, batch {BATCH}, CPU\n\n" + profile_steps(profiled))
    e2e = {}
    for item in filter(None, a.e2e.split(",")):
        version, size = item.split("@")
        e2e[f"yolov5{version}@{size}"] = end_to_end(version, int(size), data, work, reference_root, a.epochs)
        print(item, json.dumps(e2e[f"yolov5{version}@{size}"]), flush=True)
    setup["load_average_1min_at_end"] = os.getloadavg()[0]
    result, table = summarise(setup, steps, e2e, a.epochs)
    (out / "train.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "train.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
