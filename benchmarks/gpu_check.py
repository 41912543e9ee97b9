"""The GPU check: everything that needs CUDA, in one command of under ten minutes.

On a CUDA machine it runs, in order:

1. the CUDA-only tests: fp16 autocast with loss scaling, AutoBatch on the GPU's memory (YOLOv5 and YOLOv8), the
   doctor's corpus on CUDA, TensorRT export, val and predict of YOLOv5 and anchor-free detectors and segmenters
   (skipped by pytest where the tensorrt package is missing), the
   tensor augmentation path's CUDA batches against its CPU ones;
2. a DDP run with nccl: ``yolotrain train --device 0,1`` on two GPUs (one GPU: the same run on it alone);
3. the training step at batch 64, 640 px (``Trainer.train_batch``: forward, loss, backward, clipping,
   optimiser, EMA, fp16 autocast): step time, images/s, and the FLOP/s reached as a fraction of the
   fp16 matrix-multiply throughput measured on the same GPU;
4. ``benchmarks/bench_gpu_augment.py --device cuda``: training images/s of ``--augment-device cuda`` (nvJPEG,
   mosaic, warp and HSV on the GPU) against the loader's own augmentation (``results/gpu_augment.json``);

and writes ``benchmarks/results/gpu.json``. Where there is no CUDA GPU it says so in one line.

    bash benchmarks/gpu_check.sh        # or: make gpu-check
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CUDA_TESTS = ["tests/test_gpu.py", "tests/test_autobatch.py", "tests/test_doctor_cases.py", "tests/test_deploy.py",
              "tests/test_anchor_free_export.py", "tests/test_gpu_augment.py", "tests/test_data_mosaic.py"]
CUDA_SELECTION = "cuda or tensorrt or fp16 or measures_the_gpu"
BATCH, IMG_SIZE, STEPS = 64, 640, 20


def run(argv: list[str], cwd: Path, timeout: float) -> dict[str, object]:
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return {"command": " ".join(argv[1:]), "returncode": result.returncode,
            "seconds": round(time.perf_counter() - started, 1), "tail": (result.stdout + result.stderr)[-1500:]}


def matmul_flops(dtype: torch.dtype = torch.float16, size: int = 8192, repeats: int = 20) -> float:
    """FLOP/s of a large dense matrix product on this GPU: the peak a training step is measured against."""
    a, b = (torch.randn(size, size, device="cuda", dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - started)


def train_step(work: Path) -> dict[str, float]:
    """The trainer's own iteration at batch 64, 640 px with fp16 autocast, timed after warm-up."""
    from torch.utils.flop_counter import FlopCounterMode

    from yolotrain.data import generate_shapes_dataset
    from yolotrain.engine.config import resolve_config
    from yolotrain.engine.trainer import Trainer

    data = generate_shapes_dataset(root=work / "shapes", n_train=BATCH, n_val=4, img_size=IMG_SIZE)
    config = resolve_config(None, data=str(data / "data.yaml"), model="yolov5s", img_size=IMG_SIZE, batch_size=BATCH,
                            workers=0, autoanchor=False, tensorboard=False, project=str(work / "runs"),
                            device="cuda:0", amp="fp16")
    trainer = Trainer(config)
    trainer.setup()
    trainer.ddp.train()
    trainer.accumulate = 1
    batch = next(iter(trainer.train_loader))
    steps = iter(range(1, 1 << 30))
    for _ in range(5):
        trainer.train_batch(batch, epoch=0, index=0, step=next(steps))
    with FlopCounterMode(display=False) as counter:
        trainer.train_batch(batch, epoch=0, index=0, step=next(steps))
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(STEPS):
        trainer.train_batch(batch, epoch=0, index=0, step=next(steps))
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - started) / STEPS
    flops = counter.get_total_flops() / step_s
    peak = matmul_flops()
    return {"model": "yolov5s", "batch": BATCH, "img_size": IMG_SIZE, "amp": "fp16", "step_ms": step_s * 1e3,
            "images_per_s": BATCH / step_s, "step_tflops": flops / 1e12, "fp16_matmul_tflops": peak / 1e12,
            "fraction_of_matmul_peak": flops / peak}


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA GPU on this machine; nothing was run (docs/performance.md keeps 'GPU: not measured')")
        return 0
    gpus = torch.cuda.device_count()
    report: dict[str, object] = {"gpu": torch.cuda.get_device_name(0), "gpus": gpus, "torch": torch.__version__,
                                 "cuda": torch.version.cuda}
    report["cuda_tests"] = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CUDA_TESTS,
                                "-k", CUDA_SELECTION], ROOT, timeout=240)
    with tempfile.TemporaryDirectory() as folder:
        device = "0,1" if gpus >= 2 else "0"
        report["ddp"] = run([sys.executable, "-m", "yolotrain", "train", "--device", device, "--epochs", "2",
                             "--img", "320", "--batch", "32", "--project", folder], ROOT, timeout=180)
        report["ddp"]["processes"] = 2 if gpus >= 2 else 1
        report["train_step"] = train_step(Path(folder))
    report["gpu_augment"] = run([sys.executable, "benchmarks/bench_gpu_augment.py", "--device", "cuda"], ROOT,
                                timeout=240)
    out = ROOT / "benchmarks" / "results" / "gpu.json"
    out.write_text(json.dumps(report, indent=1))
    failed = [name for name in ("cuda_tests", "ddp", "gpu_augment") if report[name]["returncode"] != 0]
    step = report["train_step"]
    print(f"gpu-check: {report['gpu']} x{gpus}; CUDA tests {'failed' if 'cuda_tests' in failed else 'passed'}; "
          f"DDP {'failed' if 'ddp' in failed else 'passed'}; augment on the GPU "
          f"{'failed' if 'gpu_augment' in failed else 'timed'}; step {step['step_ms']:.0f} ms, "
          f"{step['images_per_s']:.0f} img/s, {step['fraction_of_matmul_peak']:.0%} of fp16 matmul FLOP/s; "
          f"{os.path.relpath(out, ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
