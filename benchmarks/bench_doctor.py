"""Training-step cost of ``yolotrain.doctor.watch()`` against a plain step and anomaly mode.

``nan`` is ``watch(nan=True)`` (the in-place tracking plus the NaN-origin checks), measured
against anomaly mode with its NaN check on (``anomaly_nan``), the mode PyTorch offers for NaNs.

Target: yolov5n at 320x320, batch 8, CPU, AdamW. The modes run interleaved, round
after round, so background load hits them alike; min and median per mode are reported and
written to ``benchmarks/results/doctor.json``.

``startup`` times whole processes, alternating round after round: ``python -m inplace_doctor
--help`` against ``python -m yolotrain doctor --help`` (the console script's path: the doctor
without the rest of yolotrain), with a bare interpreter and ``python -m yolotrain --help`` (the
whole command line) for scale. The target: yolotrain's doctor starts within a few tens of ms of
``inplace-doctor``'s.

    PYTHONPATH=src:packages/inplace-doctor/src python benchmarks/bench_doctor.py [--rounds 7] [--batch 8]
        [--size 320] [--startup-rounds 9] [--only step|startup]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import resource
import statistics
import subprocess
import sys
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


# Whole processes timed by measure_startup, each as ``python ARGS``.
STARTUP_COMMANDS: dict[str, list[str]] = {
    "python": ["-c", "pass"],
    "inplace-doctor": ["-m", "inplace_doctor", "--help"],
    "yolotrain doctor": ["-m", "yolotrain", "doctor", "--help"],
    "yolotrain": ["-m", "yolotrain", "--help"],
}


def measure_startup(rounds: int) -> dict[str, dict[str, list[float]]]:
    """Wall and CPU seconds (the child's user + system time) of each of ``STARTUP_COMMANDS``, the commands
    alternating round after round after one unrecorded round (which fills the page cache)."""
    times: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in STARTUP_COMMANDS}
    for recorded in [False] + [True] * rounds:
        for name, args in STARTUP_COMMANDS.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall = time.perf_counter()
            subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - wall
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if recorded:
                times[name]["wall"].append(wall)
                times[name]["cpu"].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return times


def imported_modules(args: list[str]) -> dict[str, int]:
    """Each module ``python ARGS`` imports, with the microseconds spent in its own code (``-X importtime``)."""
    log = subprocess.run([sys.executable, "-X", "importtime", *args], check=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True).stderr
    modules = {}
    for line in log.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            own_us, _, name = line.removeprefix("import time:").split("|")
            modules[name.strip()] = int(own_us)
    return modules


def startup_summary(times: dict[str, dict[str, list[float]]]) -> dict:
    """Medians per command, and yolotrain's doctor against inplace-doctor: the ratio of the medians and the
    median of the rounds' differences (each round ran both back to back, so the load on the machine was alike)."""
    ours, theirs = times["yolotrain doctor"], times["inplace-doctor"]
    doctor_imports = imported_modules(STARTUP_COMMANDS["yolotrain doctor"])
    theirs_imports = imported_modules(STARTUP_COMMANDS["inplace-doctor"])
    return {
        "commands": {name: " ".join(["python", *args]) for name, args in STARTUP_COMMANDS.items()},
        "rounds": len(ours["wall"]),
        "median_s": {name: statistics.median(t["wall"]) for name, t in times.items()},
        "cpu_median_s": {name: statistics.median(t["cpu"]) for name, t in times.items()},
        "doctor_ratio": statistics.median(ours["wall"]) / statistics.median(theirs["wall"]),
        "doctor_cpu_ratio": statistics.median(ours["cpu"]) / statistics.median(theirs["cpu"]),
        "doctor_extra_ms": 1000 * statistics.median(a - b for a, b in zip(ours["wall"], theirs["wall"])),
        "doctor_cpu_extra_ms": 1000 * statistics.median(a - b for a, b in zip(ours["cpu"], theirs["cpu"])),
        # Precise where the timings above are noisy: what yolotrain's doctor imports that inplace-doctor does not.
        "doctor_extra_imports_us": {name: us for name, us in doctor_imports.items() if name not in theirs_imports},
        "all_s": {name: t["wall"] for name, t in times.items()},
        "cpu_all_s": {name: t["cpu"] for name, t in times.items()},
    }


def step_benchmark(rounds: int, batch: int, size: int) -> dict:
    """The training step's cost under each of ``MODES``, printed and returned as doctor.json's fields."""
    workload, step = _yolo_step(batch, size)
    times = measure(step, rounds)
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
        "rounds": rounds,
        "modes": summary,
        "ratio_to_plain": {mode: {stat: summary[mode][stat] / plain[stat] for stat in stats_keys} for mode in summary},
    }
    for mode, stats in summary.items():
        ratio = result["ratio_to_plain"][mode]
        print(
            f"{mode:8s} wall min {stats['min_s']:.3f}s median {stats['median_s']:.3f}s "
            f"({ratio['min_s']:.2f}x / {ratio['median_s']:.2f}x)  cpu min {stats['cpu_min_s']:.3f}s "
            f"median {stats['cpu_median_s']:.3f}s ({ratio['cpu_min_s']:.2f}x / {ratio['cpu_median_s']:.2f}x)"
        )
    print(workload)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--startup-rounds", type=int, default=9)
    parser.add_argument("--only", choices=("step", "startup"),
                        help="measure one part; the other part of an earlier doctor.json is kept")
    args = parser.parse_args()
    result = json.loads(RESULTS.read_text()) if args.only and RESULTS.is_file() else {}
    if args.only != "startup":
        result.update(step_benchmark(args.rounds, args.batch, args.size))
    if args.only != "step":
        startup = startup_summary(measure_startup(args.startup_rounds))
        for name, median in startup["median_s"].items():
            print(f"start-up {name:16s} wall median {median:.3f}s  cpu median {startup['cpu_median_s'][name]:.3f}s")
        print(f"yolotrain doctor / inplace-doctor: wall {startup['doctor_ratio']:.3f}x "
              f"({startup['doctor_extra_ms']:+.0f} ms), cpu {startup['doctor_cpu_ratio']:.3f}x "
              f"({startup['doctor_cpu_extra_ms']:+.0f} ms); medians of {startup['rounds']} rounds")
        extra = startup["doctor_extra_imports_us"]
        print(f"imported by yolotrain doctor alone: {', '.join(sorted(extra))} ({sum(extra.values()) / 1000:.1f} ms)")
        result["startup"] = startup
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
