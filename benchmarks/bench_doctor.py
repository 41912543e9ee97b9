"""Training-step cost of ``yolotrain.doctor.watch()`` against a plain step and anomaly mode.

``nan`` is ``watch(nan=True)`` (the in-place tracking plus the NaN-origin checks), measured
against anomaly mode with its NaN check on (``anomaly_nan``), the mode PyTorch offers for NaNs.

Target: yolov5n at 320x320, batch 8, CPU, AdamW. The three modes run interleaved, round
after round, so background load hits them alike; min and median per mode are reported and
written to ``benchmarks/results/doctor.json``.

    PYTHONPATH=src python benchmarks/bench_doctor.py [--rounds 7] [--batch 8] [--size 320]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from yolotrain.doctor import watch

RESULTS = Path(__file__).resolve().parent / "results" / "doctor.json"


def _yolo_step(batch: int, size: int) -> tuple[str, Callable[[], None]]:
    """One AdamW step of yolov5n with its real loss, or resnet18 when the model is unavailable."""
    try:
        from yolotrain import YOLO_LOSS, Yolov5
    except ImportError:
        return _resnet_step(batch, size)
    torch.manual_seed(0)
    model = Yolov5(version="n", num_classes=80)
    model.train()
    criterion = YOLO_LOSS(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    imgs = torch.rand(batch, 3, size, size)
    boxes = torch.rand(batch * 4, 4) * 0.5 + 0.25
    image_index = torch.arange(batch).repeat_interleave(4)[:, None].float()
    classes = torch.randint(0, 80, (batch * 4, 1)).float()
    targets = torch.cat([image_index, classes, boxes], dim=1)

    def step() -> None:
        loss = criterion(model(imgs), targets, pred_size=imgs.shape[2:4])
        opt.zero_grad()
        loss.backward()
        opt.step()

    return f"yolov5n {size}x{size} batch {batch}", step


def _resnet_step(batch: int, size: int) -> tuple[str, Callable[[], None]]:
    import torchvision

    model = torchvision.models.resnet18(num_classes=80)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    imgs = torch.rand(batch, 3, size, size)
    labels = torch.randint(0, 80, (batch,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(imgs), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return f"resnet18 {size}x{size} batch {batch}", step


@contextlib.contextmanager
def _anomaly() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly(check_nan=False):
            yield


@contextlib.contextmanager
def _anomaly_nan() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly(check_nan=True):
            yield


MODES: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "plain": contextlib.nullcontext,
    "watch": watch,
    "anomaly": _anomaly,
    "nan": lambda: watch(nan=True),
    "anomaly_nan": _anomaly_nan,
}


def measure(step: Callable[[], None], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Wall and process-CPU seconds per step for each mode, modes interleaved per round.

    CPU time is reported too because on a shared machine wall time mostly measures the
    neighbours; CPU time counts only this process's work (all intra-op threads).
    """
    times: dict[str, dict[str, list[float]]] = {mode: {"wall": [], "cpu": []} for mode in MODES}
    for make in MODES.values():
        with make():
            step()
    for _ in range(rounds):
        for mode, make in MODES.items():
            with make():
                wall, cpu = time.perf_counter(), time.process_time()
                step()
                times[mode]["cpu"].append(time.process_time() - cpu)
                times[mode]["wall"].append(time.perf_counter() - wall)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=320)
    args = parser.parse_args()
    workload, step = _yolo_step(args.batch, args.size)
    times = measure(step, args.rounds)
    summary = {
        mode: {
            "min_s": min(t["wall"]),
            "median_s": statistics.median(t["wall"]),
            "cpu_min_s": min(t["cpu"]),
            "cpu_median_s": statistics.median(t["cpu"]),
            "all_s": t["wall"],
        }
        for mode, t in times.items()
    }
    plain = summary["plain"]
    stats_keys = ("min_s", "median_s", "cpu_min_s", "cpu_median_s")
    result = {
        "workload": workload,
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "rounds": args.rounds,
        "modes": summary,
        "ratio_to_plain": {mode: {stat: summary[mode][stat] / plain[stat] for stat in stats_keys} for mode in summary},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    for mode, stats in summary.items():
        ratio = result["ratio_to_plain"][mode]
        print(
            f"{mode:8s} wall min {stats['min_s']:.3f}s median {stats['median_s']:.3f}s "
            f"({ratio['min_s']:.2f}x / {ratio['median_s']:.2f}x)  cpu min {stats['cpu_min_s']:.3f}s "
            f"median {stats['cpu_median_s']:.3f}s ({ratio['cpu_min_s']:.2f}x / {ratio['cpu_median_s']:.2f}x)"
        )
    print(f"{workload}; written to {RESULTS}")


if __name__ == "__main__":
    main()
