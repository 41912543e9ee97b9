"""How far N processes with b images each drift from one process with N·b images (CPU, gloo).

Trains yolov5n from scratch in float32 on the built-in shapes data twice from the same seed, once in one process
with the global batch and once under ``torchrun`` with it split over processes, and compares the final
weights (model and EMA). Two settings:

- ``frozen``: batch norm normalises with its running statistics, which stay fixed, and only the
  objectness loss (a mean over all grid cells) is trained, so nothing depends on how a batch is split
  and only floating-point summation order may differ: this measures the engine (sampler, loss scaling,
  warm-up and schedule, accumulation, averaged gradients, EMA).
- ``default``: the real model and loss, with per-process batch-norm statistics (the CPU has no
  SyncBatchNorm) and box/class losses averaged over each process's own matched targets, as the
  reference's DDP does.

    python benchmarks/bench_ddp.py                 # writes benchmarks/results/ddp.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("frozen", "default")


def train_once(mode: str, data: str, name: str, project: str, batch: int, epochs: int, optimizer: str) -> None:
    """One run (in this process, or as a torchrun worker); ``frozen`` as described above."""
    import torch.nn.functional as F
    from torch import nn

    from yolotrain import train

    settings: dict[str, object] = {}
    if mode == "frozen":
        def fixed_statistics(self: nn.BatchNorm2d, x):  # noqa: ANN001
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)

        nn.BatchNorm2d.forward = fixed_statistics
        settings = {"box": 0.0, "cls": 0.0}
    # float32: bf16 autocast (the default on CPUs with native bf16) rounds a batch of 4 and one of 8 differently
    train(data=data, project=project, name=name, img_size=64, batch_size=batch, nominal_batch=batch,
          epochs=epochs, workers=0, seed=3, val=False, plots=False, optimizer=optimizer, amp="off", **settings)


def weight_difference(a: Path, b: Path) -> dict[str, float]:
    """Largest absolute difference of the model's parameters and of the EMA's, between two runs."""
    from safetensors.torch import load_file

    first, second = (load_file(str(run / "weights" / "last.safetensors")) for run in (a, b))
    skip = ("running_var", "running_mean", "num_batches_tracked")
    result = {}
    for prefix in ("model.", "ema."):
        keys = [k for k in first if k.startswith(prefix) and not k.endswith(skip)]
        result[prefix.rstrip(".")] = max(float((first[k] - second[k]).abs().max()) for k in keys)
    return result


def compare(mode: str, data: str, work: Path, processes: int, per_process: int, epochs: int,
            optimizer: str) -> dict[str, object]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    batch = processes * per_process
    common = [__file__, "train", mode, "--data", data, "--project", str(work), "--batch", str(batch),
              "--epochs", str(epochs), "--optimizer", optimizer]
    subprocess.run([sys.executable, *common, "--name", f"{mode}-1x{batch}"], env=env, check=True,
                   capture_output=True)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                    str(processes), *common, "--name", f"{mode}-{processes}x{per_process}"], env=env, check=True,
                   capture_output=True)
    diff = weight_difference(work / f"{mode}-1x{batch}", work / f"{mode}-{processes}x{per_process}")
    return {"mode": mode, "single": f"1x{batch}", "ddp": f"{processes}x{per_process}", "epochs": epochs,
            "optimizer": optimizer, "max_abs_weight_diff": diff}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    worker = sub.add_parser("train")
    worker.add_argument("mode", choices=MODES)
    for flag in ("--data", "--project", "--name"):
        worker.add_argument(flag, required=True)
    worker.add_argument("--batch", type=int, required=True)
    worker.add_argument("--epochs", type=int, required=True)
    worker.add_argument("--optimizer", required=True)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--images", type=int, default=32, help="training images of the shapes data")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--per-process", type=int, default=4, help="images per process and step")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--optimizer", default="SGD", help="SGD (the reference's): its steps scale with the gradient")
    parser.add_argument("--keep", help="leave the runs in this folder (default: a temporary one)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ddp.json"))
    args = parser.parse_args(argv)
    if args.command == "train":
        train_once(args.mode, args.data, args.name, args.project, args.batch, args.epochs, args.optimizer)
        return
    from yolotrain.data import generate_shapes_dataset

    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(args.keep or temporary)
        data = generate_shapes_dataset(root=folder / "data", n_train=args.images, n_val=4, img_size=64)
        rows = [compare(mode, str(data / "data.yaml"), folder, args.processes, args.per_process, args.epochs,
                        args.optimizer) for mode in args.modes]
    for row in rows:
        print(json.dumps(row))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"images": args.images, "device": "cpu (gloo)", "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
