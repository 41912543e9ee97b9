"""Every export format and precision available here, scored and timed against PyTorch in one process.

Official yolov5n on coco128 at ``--img``: each format × precision is exported, then run through
``yolotrain val`` (mAP50-95, images/s) and through the single-image ``predict`` path (letterbox →
model → NMS → boxes in original pixels; median latency), all on this machine's CPU. PyTorch eager
runs first and last; speeds are ratios to the faster of its two passes.

ONNX and OpenVINO exports keep a dynamic image size, so they are scored on the same rectangular
batches as PyTorch. LiteRT, TorchScript, NCNN, MNN, ExecuTorch, TensorFlow (SavedModel, GraphDef), TF.js (run under
Node) and PaddlePaddle exports are fixed at ``--img`` square (batch 1): they are compared with PyTorch scored on
square letterboxed batches too (``pytorch_square`` below). The ``torchscript fp32-optimize`` row is
``--optimize`` (the lite interpreter's archive, frozen), run by ``torch.jit.load`` as the others.
``--format edgetpu`` writes the ``tflite int8`` row's model (the Edge TPU compiles it): no row of its own.

PaddlePaddle crashes in a process that loaded TensorFlow, so its rows run in a process of their own: a
run that has other rows to run starts this script again for them (``--formats paddle:fp32``), which
merges them in as a re-run, with PyTorch passes of its own.

int8 exports are calibrated on the coco128 images themselves (coco128 has no separate split), so
they are scored on their calibration images; the table says so.

The ``--nms`` exports (ONNX, OpenVINO; conf 0.001, iou 0.6, multi-label, max_det 300: the val
settings) are checked against our NMS run on PyTorch's output for every coco128 image.

    python benchmarks/bench_export.py [--img 640] [--images 128] [--repeats 20]

``--formats onnx:int8,openvino:int8`` runs only those rows (with both PyTorch passes, and a square
one when a fixed-size row runs: the references of their deltas and speed ratios, recorded with the
re-run) and puts them in an existing ``--out`` in place of its own or beside them; the other rows, the
table's PyTorch rows and the NMS checks are kept from it. Re-run rows are marked in the table, with the
date and load of their run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import COCO128, ROOT, latency
from common import YOLOV5N as WEIGHTS

from yolotrain.data.sources import link_subset

# (format, precision) rows, each run when its packages are installed.
ROWS = [("onnx", "fp32"), ("onnx", "fp16"), ("onnx", "int8"), ("openvino", "fp32"), ("openvino", "fp16"),
        ("openvino", "int8"), ("tflite", "fp32"), ("tflite", "fp16"), ("tflite", "int8"), ("torchscript", "fp32"),
        ("torchscript", "fp32-optimize"), ("ncnn", "fp32"), ("ncnn", "fp16"), ("mnn", "fp32"), ("mnn", "fp16"),
        ("executorch", "fp32"), ("saved_model", "fp32"), ("pb", "fp32"), ("tfjs", "fp32"), ("paddle", "fp32")]
NEEDS = {"onnx": ("onnxruntime",), "openvino": ("openvino", "nncf"),
         "tflite": ("litert_torch", "ai_edge_litert", "ai_edge_quantizer"), "torchscript": (),
         "ncnn": ("ncnn", "pnnx"), "mnn": ("MNN",), "executorch": ("executorch",),
         "saved_model": ("tensorflow", "tf_keras", "onnx2tf"), "pb": ("tensorflow", "tf_keras", "onnx2tf"),
         "tfjs": ("tensorflow", "tf_keras", "onnx2tf"), "paddle": ("paddle", "x2paddle")}
# Formats whose rows run in a process of their own when other rows run too (PaddlePaddle's native library crashes
# the process when it loads after TensorFlow's).
OWN_PROCESS = frozenset({"paddle"})


def unavailable(fmt: str) -> str | None:
    """Why ``fmt``'s rows cannot run here, or None."""
    missing = [name for name in NEEDS[fmt] if importlib.util.find_spec(name) is None]
    if missing:
        return f"needs {', '.join(missing)} (not installed)"
    if fmt == "tfjs":  # its converter's environment (.venv-tfjs) and Node's TF.js packages (.node-tfjs)
        from yolotrain.interop.formats import tfjs

        return tfjs.unavailable() or tfjs.node_unavailable()
    return None


def available(fmt: str) -> bool:
    return unavailable(fmt) is None


def scored(weights, data: Path, img: int, rect: bool, image: np.ndarray | None, repeats: int) -> dict:
    """val mAP and speed (the second of two passes), and single-image predict latency unless ``image`` is None."""
    from yolotrain.eval import val
    from yolotrain.prediction.run import Predictor

    # The exports measured here were written by this script: trusted, TorchScript and TensorRT included.
    options = {"img_size": img, "batch_size": 32, "workers": 0, "rect": rect, "verbose": False, "plots": False,
               "half": False, "trust_code": True}
    val(weights, data, **options)  # warm-up
    t = time.perf_counter()
    metrics = val(weights, data, **options)
    seconds = time.perf_counter() - t
    images = len(list((data.parent / "images" / "val").iterdir()))
    result = {"mAP50-95": metrics.map, "mAP50": metrics.map50, "val_images_per_s": images / seconds, "val_s": seconds}
    if image is not None:
        predictor = Predictor(weights, img_size=img, device="cpu", half=False, trust_code=True)
        result["predict_ms"] = latency(lambda: predictor.predict_image(image), repeats) * 1e3
    return result


def nms_agreement(path: Path, data: Path, img: int) -> dict:
    """Per image of the dataset, the export's built-in NMS against ours on PyTorch's decoded output."""
    from yolotrain.eval import non_max_suppression
    from yolotrain.eval.inference import load_inference_model
    from yolotrain.eval.val import build_val_loader
    from yolotrain.interop import load_exported

    exported = load_exported(path)
    model, _ = load_inference_model(str(WEIGHTS), "cpu", half=False)
    s = exported.nms_settings
    loader = build_val_loader(data, model.num_classes, img, 32, rect=True, workers=0)
    same = count = 0
    worst_box = worst_score = 0.0
    with torch.inference_mode():
        for imgs, *_ in loader:
            ours = non_max_suppression(model(imgs), s["conf"], s["iou"], multi_label=s["multi_label"],
                                       max_det=s["max_det"])
            theirs = exported.detections(imgs, s["conf"], s["iou"], s["max_det"], s["multi_label"])
            for a, b in zip(ours, theirs):
                count += 1
                if len(a) == len(b):
                    a, b = a[a[:, 4].argsort(descending=True, stable=True)], b[b[:, 4].argsort(descending=True,
                                                                                              stable=True)]
                    if torch.equal(a[:, 5], b[:, 5]):
                        same += 1
                        worst_box = max(worst_box, (a[:, :4] - b[:, :4]).abs().max().item() if len(a) else 0.0)
                        worst_score = max(worst_score, (a[:, 4] - b[:, 4]).abs().max().item() if len(a) else 0.0)
    return {"images": count, "images_with_identical_detections": same, "max_box_diff_px": worst_box,
            "max_score_diff": worst_score}


def size_mb(path: Path) -> float:
    """An export's size: the file and those beside it that share its stem (metadata), or the folder's files."""
    files = path.rglob("*") if path.is_dir() else path.parent.glob(path.stem + ".*")
    return sum(f.stat().st_size for f in files if f.is_file()) / 2**20


def selected_rows(spec: str | None) -> list[tuple[str, str]]:
    """The ``format:precision`` rows named in ``spec`` (all rows when None), in table order."""
    if spec is None:
        return list(ROWS)
    asked = {tuple(item.strip().split(":", 1)) for item in spec.split(",") if item.strip()}
    unknown = sorted(":".join(row) for row in asked - set(ROWS))
    if unknown or not asked:
        raise ValueError(f"--formats: unknown rows {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(f'{f}:{p}' for f, p in ROWS)}")
    return [row for row in ROWS if row in asked]


def merge_rerun(previous: dict, rows: list[dict], selected: list[tuple[str, str]], skipped: dict[str, str],
                rerun: dict) -> dict:
    """``previous`` with the re-run ``rows`` (marked with the re-run's date) in place of its own, in
    table order, and the re-run, with its PyTorch passes, recorded under ``reruns`` (earlier re-runs whose
    rows it all replaced are dropped). The table's PyTorch rows stay those of the run they came from."""
    for row in rows:
        row["rerun"] = rerun["date"]
    replaced = {(row["format"], row["precision"]): row for row in previous["formats"] + rows}
    shown = [r for r in previous.get("reruns", []) if not set(selected_rows(r["formats"])) <= set(selected)]
    previous.update(formats=[replaced[row] for row in ROWS if row in replaced], reruns=shown + [rerun])
    for key in [f"{fmt} {precision}" for fmt, precision in selected]:
        previous["skipped"].pop(key, None)
    previous["skipped"].update(skipped)
    return previous


def markdown(result: dict) -> str:
    base = result["pytorch"]
    square = result["pytorch_square"]
    lines = ["| format | precision | mAP50-95 | Δ vs PyTorch | val images/s | × PyTorch | predict ms | × PyTorch |",
             "|---|---|---|---|---|---|---|---|",
             f"| PyTorch eager | fp32 | {base['mAP50-95']:.4f} | 0 (rect batches) | {base['val_images_per_s']:.2f} | "
             f"1.00 | {base['predict_ms']:.1f} | 1.00 |",
             f"| PyTorch eager, square 640 | fp32 | {square['mAP50-95']:.4f} | 0 (square batches) | "
             f"{square['val_images_per_s']:.2f} | {square['val_images_per_s'] / base['val_images_per_s']:.2f} | "
             f"{square['predict_ms']:.1f} | {base['predict_ms'] / square['predict_ms']:.2f} |"]
    for row in result["formats"]:
        precision = row["precision"] + (" (re-run)" if "rerun" in row else "")
        lines.append(f"| {row['format']} | {precision} | {row['mAP50-95']:.4f} | {row['delta_mAP']:+.4f} | "
                     f"{row['val_images_per_s']:.2f} | {row['val_speedup']:.2f} | {row['predict_ms']:.1f} | "
                     f"{row['predict_speedup']:.2f} |")
    lines.append("\n`--format edgetpu` writes the tflite int8 row's model (the int8 LiteRT model Google's Edge TPU "
                 "compiler reads; no Edge TPU here to time it on).")
    for rerun in result.get("reruns", []):
        ref = rerun["pytorch"]
        square_ref = rerun.get("pytorch_square")
        on_square = "" if square_ref is None else (
            f" (square batches: mAP50-95 {square_ref['mAP50-95']:.4f}, the fixed-size rows' Δ is to it, "
            f"{square_ref['val_images_per_s']:.2f} val images/s, predict {square_ref['predict_ms']:.1f} ms)")
        passes = " and ".join(f"{run['val_images_per_s']:.2f} val images/s, predict {run['predict_ms']:.1f} ms"
                              for run in ref.get("passes", {}).values())
        spread = f"; its two passes (first and last) gave {passes}" if passes else ""
        lines.append(f"\nRe-run {rerun['date']} (`--formats {rerun['formats']}`, 1-minute load average "
                     f"{rerun['load_average_1min_at_start']:.1f}): PyTorch mAP50-95 {ref['mAP50-95']:.4f}, "
                     f"{ref['val_images_per_s']:.2f} val images/s, predict {ref['predict_ms']:.1f} ms{on_square}; "
                     f"the re-run rows' ratios are to these, the faster of its two rectangular-batch passes{spread}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--img", type=int, default=640)
    p.add_argument("--images", type=int, default=128)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "export.json"))
    p.add_argument("--formats", default=None, help="comma list of format:precision rows to run and merge into an "
                   "existing --out (default: run every row and write --out afresh)")
    a = p.parse_args()
    if not (COCO128.is_dir() and WEIGHTS.is_file()):
        sys.exit(f"needs {COCO128} and {WEIGHTS}")
    try:
        selected = selected_rows(a.formats)
    except ValueError as exc:
        p.error(str(exc))
    elsewhere = [row for row in selected if row[0] in OWN_PROCESS and available(row[0])]
    if len(elsewhere) < len(selected):
        selected = [row for row in selected if row not in elsewhere]
    else:
        elsewhere = []
    out = Path(a.out)
    previous = None
    if a.formats is not None:
        if not out.is_file():
            p.error(f"--formats replaces rows of an existing {out}: run every row first")
        previous = json.loads(out.read_text())
    import cv2

    from yolotrain.interop import export
    from yolotrain.interop.exporting.exporter import DYNAMIC_FORMATS, FORMATS, NMS_FORMATS

    tmp = Path(tempfile.mkdtemp(prefix="bench-export-"))
    data = link_subset(COCO128 / "data.yaml", tmp / "data", a.images)
    image = cv2.imread(str(sorted((COCO128 / "images" / "train2017").glob("*.jpg"))[0]))
    load_before = os.getloadavg()[0]

    first = scored(str(WEIGHTS), data, a.img, True, image, a.repeats)
    rerun_square = previous is None or any(fmt not in DYNAMIC_FORMATS for fmt, _ in selected)
    square = scored(str(WEIGHTS), data, a.img, False, image, a.repeats) if rerun_square else previous["pytorch_square"]
    rows, skipped = [], {}
    for fmt, precision in selected:
        if not available(fmt):
            skipped[f"{fmt} {precision}"] = unavailable(fmt)
            continue
        t = time.perf_counter()
        path = export(str(WEIGHTS), fmt, out=tmp / f"yolov5n_{fmt}_{precision}{FORMATS[fmt]}",
                      img_size=a.img, dynamic_size=fmt in DYNAMIC_FORMATS, half=precision == "fp16",
                      int8=precision == "int8", optimize=precision.endswith("-optimize"), data=data,
                      calibration_images=a.images)
        export_s = time.perf_counter() - t
        dynamic = fmt in DYNAMIC_FORMATS
        rows.append({"format": fmt, "precision": precision, "export_s": export_s, "rect_batches": dynamic,
                     "calibration": f"the {a.images} scored coco128 images" if precision == "int8" else None,
                     "file_mb": size_mb(path), **scored(str(path), data, a.img, dynamic, image, a.repeats)})
        print(rows[-1], file=sys.stderr)
    last = scored(str(WEIGHTS), data, a.img, True, image, a.repeats)
    pytorch = {"mAP50-95": first["mAP50-95"], "mAP50": first["mAP50"],
               "val_images_per_s": max(first["val_images_per_s"], last["val_images_per_s"]),
               "predict_ms": min(first["predict_ms"], last["predict_ms"]),
               "passes": {"first": first, "last": last}}
    for row in rows:
        ref = pytorch if row["rect_batches"] else square
        row["delta_mAP"] = row["mAP50-95"] - ref["mAP50-95"]
        row["val_speedup"] = row["val_images_per_s"] / pytorch["val_images_per_s"]
        row["predict_speedup"] = pytorch["predict_ms"] / row["predict_ms"]

    if previous is not None:
        rerun = {"date": datetime.date.today().isoformat(), "formats": ",".join(f"{f}:{p}" for f, p in selected),
                 "load_average_1min_at_start": load_before, "pytorch": pytorch}
        if rerun_square:
            rerun["pytorch_square"] = square
        write(out, merge_rerun(previous, rows, selected, skipped, rerun))
        run_elsewhere(elsewhere, a)
        return

    nms = {}
    for fmt in sorted(NMS_FORMATS):
        if available(fmt):
            path = export(str(WEIGHTS), fmt, out=tmp / f"yolov5n_{fmt}_nms.{'xml' if fmt == 'openvino' else fmt}",
                          img_size=a.img, dynamic_size=True, nms=True, conf=0.001, iou=0.6, max_det=300,
                          multi_label=True)
            nms[fmt] = {**nms_agreement(path, data, a.img),
                        **scored(str(path), data, a.img, True, None, a.repeats)}
            nms[fmt]["delta_mAP"] = nms[fmt]["mAP50-95"] - pytorch["mAP50-95"]
            print(fmt, "nms", nms[fmt], file=sys.stderr)

    result = {
        "setup": {"weights": "official yolov5n.pt", "data": f"coco128 ({a.images} images)", "img_size": a.img,
                  "val_batch_size": 32, "device": "cpu", "cpu_cores": os.cpu_count(),
                  "torch_threads": torch.get_num_threads(), "load_average_1min_at_start": load_before,
                  "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                  "predict_repeats": a.repeats},
        "pytorch": pytorch, "pytorch_square": square, "formats": rows, "nms_exports": nms, "skipped": skipped,
    }
    write(out, result)
    run_elsewhere(elsewhere, a)


def run_elsewhere(rows: list[tuple[str, str]], a: argparse.Namespace) -> None:
    """``rows`` run by this script in a process of its own, merged into ``--out`` as a re-run."""
    if rows:
        subprocess.run([sys.executable, __file__, "--formats", ",".join(f"{f}:{p}" for f, p in rows),
                        "--out", a.out, "--img", str(a.img), "--images", str(a.images), "--repeats", str(a.repeats)],
                       check=True)


def write(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
