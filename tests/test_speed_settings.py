"""The speed settings change how fast, not what: channels-last, bf16 autocast, the fused optimiser and
half-precision inference, each checked against the plain float32 path; and the training benchmark runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from yolotrain import YoloLoss, Yolov5, train
from yolotrain.checkpoint import read_checkpoint, save_checkpoint
from yolotrain.cli import main
from yolotrain.data.shapes import generate_shapes_dataset
from yolotrain.data.shapes_video import generate_shapes_video
from yolotrain.engine.config import resolve_config
from yolotrain.engine.optim import build_optimizer
from yolotrain.engine.prepare import autocast_dtype, precision_line
from yolotrain.engine.trainer import Trainer
from yolotrain.eval.inference import load_inference_model
from yolotrain.eval.inference import precision_line as inference_precision_line
from yolotrain.settings import ConfigError

ROOT = Path(__file__).resolve().parents[1]
QUICK = dict(img_size=64, batch_size=4, workers=0, plots=False, autoanchor=False, tensorboard=False, epochs=1)


def conv_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.ndim == 4]


@pytest.mark.parametrize("channels_last", [True, False])
def test_the_layout_setting_reaches_the_model(tiny_data, tmp_path, channels_last):
    trainer = Trainer(resolve_config(None, data=str(tiny_data), project=str(tmp_path), channels_last=channels_last,
                                     **QUICK))
    trainer.setup()
    layout = torch.channels_last if channels_last else torch.contiguous_format
    assert all(p.is_contiguous(memory_format=layout) for p in conv_weights(trainer.model))
    assert all(p.is_contiguous(memory_format=layout) for p in conv_weights(trainer.ema.module))


def test_channels_last_trains_to_the_same_weights(tiny_data, tmp_path):
    """Same seed, same batches: the layout changes the order of float operations only."""
    runs = {layout: train(data=str(tiny_data), project=str(tmp_path), name=str(layout), channels_last=layout,
                          amp="off", **QUICK)
            for layout in (True, False)}
    nhwc, nchw = (read_checkpoint(runs[layout].last).model_state for layout in (True, False))
    assert nhwc.keys() == nchw.keys()
    for key in nhwc:
        torch.testing.assert_close(nhwc[key], nchw[key], rtol=1e-3, atol=1e-4, msg=key)


def test_bf16_autocast_trains_and_saves_float32_weights(tiny_data, tmp_path, capsys):
    result = train(data=str(tiny_data), project=str(tmp_path), amp="bf16", **QUICK)
    assert "Precision: bfloat16 mixed precision on cpu (--amp bf16" in capsys.readouterr().out
    contents = read_checkpoint(result.last)
    assert contents.metadata["precision"] == "bf16"
    assert {t.dtype for t in contents.model_state.values() if t.is_floating_point()} == {torch.float32}
    assert all(torch.isfinite(t).all() for t in contents.model_state.values() if t.is_floating_point())
    rows = (result.save_dir / "results.csv").read_text().splitlines()
    assert len(rows) == 2 and "nan" not in rows[1]


@pytest.mark.parametrize(("amx", "avx512_bf16", "expected"), [
    (False, False, None), (False, True, torch.bfloat16), (True, False, torch.bfloat16)])
def test_auto_precision_is_bf16_on_cpus_with_native_bf16(monkeypatch, amx, avx512_bf16, expected):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    cpu = torch.device("cpu")
    assert autocast_dtype("auto", cpu) is expected
    assert autocast_dtype("off", cpu) is None and autocast_dtype("bf16", cpu) is torch.bfloat16
    line = precision_line("auto", autocast_dtype("auto", cpu), cpu)
    if expected is None:
        assert line == "Precision: float32 on cpu (--amp auto: this CPU has no native bfloat16 instructions)"
    else:
        assert line == (f"Precision: bfloat16 mixed precision on cpu (--amp auto: native on this CPU "
                        f"({'AMX' if amx else 'AVX512-BF16'}); --amp off for float32)")
    assert autocast_dtype("auto", torch.device("cuda")) is torch.float16


def test_the_run_says_and_records_the_precision_auto_chose(tiny_data, tmp_path, capsys):
    result = train(data=str(tiny_data), project=str(tmp_path), **QUICK)
    first = capsys.readouterr().out.splitlines()[0]
    chosen = autocast_dtype("auto", torch.device("cpu"))
    assert first.startswith("Precision: " + ("bfloat16 mixed precision" if chosen else "float32") + " on cpu")
    assert read_checkpoint(result.last).metadata["precision"] == ("bf16" if chosen else "fp32")


def test_fp16_on_the_cpu_is_refused_in_one_line(tiny_data, tmp_path):
    with pytest.raises(ConfigError, match="amp fp16 needs a CUDA device; on the CPU use amp bf16"):
        train(data=str(tiny_data), project=str(tmp_path), amp="fp16", device="cpu", **QUICK)
    with pytest.raises(ConfigError, match="amp"):
        resolve_config(None, amp="fp8")


def test_half_precision_maps_are_scored_in_float32():
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=3).train()
    maps = [m.detach() for m in model(torch.rand(2, 3, 64, 64))]
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [1, 2, 0.3, 0.6, 0.2, 0.2]])
    criterion = YoloLoss(model)
    half = [m.to(torch.bfloat16).requires_grad_() for m in maps]
    loss = criterion(half, targets)
    assert loss.dtype == torch.float32
    # Exactly the loss of the same values in float32: nothing is computed in bf16.
    torch.testing.assert_close(loss, criterion([m.float() for m in half], targets), rtol=0, atol=0)
    loss.backward()
    assert all(m.grad is not None and m.grad.dtype == torch.bfloat16 for m in half)


def test_the_fused_optimiser_steps_like_the_per_tensor_loop():
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2)
    twin = Yolov5("n", num_classes=2)
    twin.load_state_dict(model.state_dict())
    fused = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4)
    assert fused.defaults["fused"]
    looped = build_optimizer(twin, "SGD", 0.01, 0.937, 5e-4)
    for group in looped.param_groups:
        group["fused"] = False
    for _ in range(3):
        grads = [torch.randn_like(p) for p in model.parameters()]
        for params, optimizer in ((model.parameters(), fused), (twin.parameters(), looped)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            optimizer.step()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)


def test_half_inference_on_the_cpu_runs_bf16_and_decodes_in_float32():
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2).eval()
    full, _ = load_inference_model(model, "cpu", half=False)
    half, _ = load_inference_model(model, "cpu", half=True)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in conv_weights(half))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the caller's model is untouched
    x = torch.rand(1, 3, 128, 160)
    with torch.inference_mode():
        ref, out = full(x), half(x.to(torch.bfloat16))
    assert out.dtype == torch.float32
    # Boxes within 2% of the float32 ones (in pixels) and scores within 0.02: bf16 weights and
    # activations, float32 decoding.
    torch.testing.assert_close(out[..., :4], ref[..., :4], rtol=0.02, atol=0.5)
    torch.testing.assert_close(out[..., 4:], ref[..., 4:], rtol=0, atol=0.02)


@pytest.mark.parametrize("native", [False, True])
def test_val_and_predict_run_in_the_cpus_native_half_precision_unless_told(monkeypatch, tmp_path, capsys, native):
    """--half auto (the default): bfloat16 where the CPU computes it natively, float32 elsewhere, and the
    val, predict and track commands open with a line saying which; --half and --no-half decide, silently."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2).eval()
    model.names = ["circle", "rectangle"]
    chosen = {half: load_inference_model(model, "cpu", half=half) for half in (None, False, True)}
    dtypes = {half: next(m.parameters()).dtype for half, (m, _) in chosen.items()}
    assert dtypes == {None: torch.bfloat16 if native else torch.float32, False: torch.float32, True: torch.bfloat16}
    line = inference_precision_line(*chosen[None])
    assert line == ("Precision: bfloat16 on cpu (--half auto: native on this CPU (AVX512-BF16); --no-half for "
                    "float32)" if native else
                    "Precision: float32 on cpu (--half auto: this CPU has no native bfloat16 instructions)")
    weights = save_checkpoint(tmp_path / "tiny", model)
    data = generate_shapes_dataset(root=tmp_path / "shapes", n_train=1, n_val=2, img_size=64) / "data.yaml"
    image = next((data.parent / "images" / "val").iterdir())
    common = ["--weights", str(weights), "--img", "64", "--device", "cpu", "--project", str(tmp_path / "runs")]
    video = generate_shapes_video(tmp_path / "video", frames=3) / "shapes.mp4"
    for command, source in (("val", ["--data", str(data), "--workers", "0"]), ("predict", ["--source", str(image)]),
                            ("track", ["--source", str(video)])):
        capsys.readouterr()
        assert main([command, *common, *source]) == 0
        assert capsys.readouterr().out.splitlines()[0] == line
        for told in ("--half", "--no-half"):
            assert main([command, *common, *source, told]) == 0
            assert "Precision:" not in capsys.readouterr().out


needs_shared = pytest.mark.skipif(not (ROOT.parent / "shared" / "weights" / "yolov5n.pt").is_file(),
                                  reason="needs ../shared")


def run_benchmark(script: str, tmp_path: Path, *args: str) -> None:
    pytest.importorskip("yolov5", reason="the benchmark compares with the reference package")
    env = {**os.environ, "YOLO_CONFIG_DIR": str(tmp_path), "YOLOV5_CONFIG_DIR": str(tmp_path)}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--smoke", *args], check=True, env=env,
                   cwd=tmp_path, capture_output=True, timeout=600)


@needs_shared
def test_the_eval_benchmark_runs(tmp_path):
    run_benchmark("bench_eval.py", tmp_path, "--out", str(tmp_path / "eval.json"))
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["setup"]["images"] == 8
    val, latency = result["val"], result["predict_latency_ms"]
    assert all(val[k] > 0 for k in ("ours_images_per_s", "ours_half_images_per_s", "reference_images_per_s"))
    # The ratios are the ones the table publishes: derived from the measured rates, not stored apart.
    assert val["speedup"] == pytest.approx(val["ours_images_per_s"] / val["reference_images_per_s"])
    assert val["half_speedup"] == pytest.approx(val["ours_half_images_per_s"] / val["reference_images_per_s"])
    assert len(val["ours_pass_s"]) == len(val["reference_pass_s"]) == val["rounds"]
    # The same official weights on the same 8 images score alike on both sides (parity, not speed).
    assert abs(val["ours_mAP50-95"] - val["reference_mAP50-95"]) < 0.01
    assert abs(val["ours_half_mAP50-95"] - val["ours_mAP50-95"]) < 0.02
    assert all(latency[k] > 0 for k in ("ours", "ours_half", "reference"))
    assert latency["ours_over_reference"] == pytest.approx(latency["ours"] / latency["reference"])


@pytest.mark.slow
@needs_shared
@pytest.mark.skipif(not (ROOT.parent / "shared" / "datasets" / "coco128-seg").is_dir(), reason="needs coco128-seg")
def test_the_segmentation_benchmark_runs(tmp_path):
    run_benchmark("bench_segment.py", tmp_path, "--out", str(tmp_path / "segment.json"))
    result = json.loads((tmp_path / "segment.json").read_text())
    step, val = result["step"], result["val"]
    assert step["speedup"] == pytest.approx(step["reference_ms"] / step["ours_ms"])
    assert val["speedup"] == pytest.approx(val["ours_images_per_s"] / val["reference_images_per_s"])
    assert all(val["peak_rss_gb"][side] > 0 for side in ("ours", "reference"))
    assert val["fp32_speedup"] == pytest.approx(val["ours_fp32_images_per_s"] / val["reference_images_per_s"])
    # The same network on the same images scores alike on both sides in float32 (parity, not speed); the
    # defaults (bfloat16 on CPUs with native bf16) move a few of the smoke run's detections at 64 px.
    (ours,), (ours_fp32,), (reference,) = (val["passes"][side] for side in ("ours", "ours_fp32", "reference"))
    for side, tolerance in ((ours_fp32, 0.01), (ours, 0.03)):
        assert abs(side["box_map"] - reference["box_map"]) < tolerance
        assert abs(side["mask_map"] - reference["mask_map"]) < tolerance


@needs_shared
def test_the_training_benchmark_runs(tmp_path):
    run_benchmark("bench_train.py", tmp_path, "--out", str(tmp_path))
    result = json.loads((tmp_path / "train.json").read_text())
    (row,) = result["steps"]
    assert result["setup"]["auto_precision"] == ("bf16" if autocast_dtype("auto", torch.device("cpu")) else "fp32")
    assert row["config"] == "yolov5n@64"
    assert all(row[k] > 0 for k in ("floor_ms", "ours_ms", "ours_fp32_ms", "reference_ms"))
    assert row["step_speedup"] == pytest.approx(row["reference_ms"] / row["ours_ms"])
    assert row["ours_over_floor"] == pytest.approx(row["ours_ms"] / row["floor_ms"])
    assert row["images_per_s"]["ours"] == pytest.approx(row["images_per_s"]["reference"] * row["step_speedup"])
    assert "| yolov5n | 64 |" in (tmp_path / "train.md").read_text()
    profile = (tmp_path / "train_profile.md").read_text()
    assert all(f"## {side}" in profile for side in ("ours", "ours_fp32", "reference"))
    assert "convolution" in profile


@pytest.mark.skipif(not (ROOT.parent / "shared" / "datasets" / "coco128").is_dir(), reason="needs ../shared coco128")
def test_the_anchor_free_benchmark_runs(tmp_path):
    pytest.importorskip("ultralytics", reason="the benchmark compares with ultralytics")
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path), "ULTRALYTICS_CONFIG_DIR": str(tmp_path)}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_anchor_free.py"), "--smoke", "--out",
                    str(tmp_path)], check=True, env=env, cwd=tmp_path, capture_output=True, timeout=600)
    result = json.loads((tmp_path / "anchor_free.json").read_text())
    assert result["setup"]["img_size"] == 64 and result["setup"]["batch_size"] == 2
    parts = result["summary"]["yolov8n"]
    assert set(parts) == {"step ms", "val s", "predict s"}
    for part in parts.values():
        assert all(part[clock][side] > 0 for clock in ("wall", "cpu") for side in ("ours", "ours_fp32", "reference"))
        # The published ratios are ultralytics' time over ours, derived from the measured times.
        assert part["speedup"] == pytest.approx(part["wall"]["reference"] / part["wall"]["ours"])
        assert part["fp32_speedup_cpu"] == pytest.approx(part["cpu"]["reference"] / part["cpu"]["ours_fp32"])
    # The same weights on the same images score alike on both sides (parity, not speed).
    val = result["raw"]["yolov8n"]["val"]
    assert val["ours_fp32"]["result"] == pytest.approx(val["reference"]["result"], abs=0.01)
    assert "| yolov8n | step ms |" in (tmp_path / "anchor_free.md").read_text()


@pytest.mark.slow
def test_compiled_training_reports_its_compile_time_and_learns_the_same(tiny_data, tmp_path, capsys):
    """``--compile``: the first step says how long it took; the weights follow the eager run's."""
    # float32 on both sides: where --amp auto picks bf16 (a CPU with AMX), compiled and eager bf16 round
    # differently and the weights drift apart beyond any tolerance that still tells learning apart.
    compiled = train(data=str(tiny_data), project=str(tmp_path), name="compiled", compile=True, amp="off", **QUICK)
    assert "torch.compile: the first step took" in capsys.readouterr().out
    eager = train(data=str(tiny_data), project=str(tmp_path), name="eager", amp="off", **QUICK)
    a, b = (read_checkpoint(r.last).model_state for r in (compiled, eager))
    assert a.keys() == b.keys()  # no "_orig_mod." prefixes: checkpoints stay loadable by every tool
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4, msg=key)


@pytest.mark.slow
@needs_shared
@pytest.mark.skipif(not (ROOT.parent / "shared" / "datasets" / "coco128-cls").is_dir(), reason="needs coco128-cls")
def test_the_classification_benchmark_runs(tmp_path):
    run_benchmark("bench_classify.py", tmp_path, "--threads", "1", "--out", str(tmp_path / "classify.json"))
    speed = json.loads((tmp_path / "classify.json").read_text())["speed"]
    assert speed["setup"]["threads"] == 1 and speed["val"]["passes"] == 1
    for name, images in (("val_split", 36), ("train_split_as_val", 161)):
        rows = speed["val"][name]
        assert rows["images"] == images
        assert rows["speedup_cpu"] == pytest.approx(rows["reference"]["cpu_s"] / rows["ours"]["cpu_s"], rel=0.01)
        assert rows["fp32_speedup_cpu"] == pytest.approx(rows["reference"]["cpu_s"] / rows["ours_fp32"]["cpu_s"],
                                                         rel=0.01)
        # The same model on the same images scores the same in float32 on both sides (parity, not speed);
        # the defaults (bfloat16 on CPUs with native bf16) within two images of it.
        fp32, reference = (rows[side] for side in ("ours_fp32", "reference"))
        assert (fp32["top1"], fp32["top5"]) == (reference["top1"], reference["top5"])
        assert abs(rows["ours"]["top1"] - reference["top1"]) <= 2 / images
