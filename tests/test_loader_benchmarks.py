"""The loader benchmark and profile scripts keep working: a few coco128 images, tiny sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COCO128 = ROOT.parent / "shared" / "datasets" / "coco128"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (COCO128 / "images").is_dir(), reason="needs ../shared coco128")]


def run(script: str, tmp_path: Path, *args: str) -> None:
    pytest.importorskip("yolov5", reason="the benchmark compares with the reference package")
    env = {**os.environ, "YOLO_CONFIG_DIR": str(tmp_path), "YOLOV5_CONFIG_DIR": str(tmp_path)}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--images", "8", *args], check=True,
                   env=env, cwd=tmp_path, capture_output=True, timeout=600)


def test_the_loader_benchmark_runs(tmp_path):
    run("bench_loader.py", tmp_path, "--sizes", "64", "--workers", "0", "1", "--epochs", "1", "--batch-size", "4",
        "--out", str(tmp_path / "loader.json"))
    report = json.loads((tmp_path / "loader.json").read_text())
    assert report["cpu_model"] and "8 images" in report["what"]
    assert [(row["img_size"], row["workers"]) for row in report["results"]] == [(64, 0), (64, 1)]
    for row in report["results"]:
        for cache in ("none", "ram"):
            ours, ref = row[f"yolotrain_{cache}"], row[f"reference_{cache}"]
            assert all(side["img_s"] > 0 and side["img_per_core_s"] > 0 for side in (ours, ref))
            # Ratios of the rates as the table publishes them (both rounded: to 2 decimals, rates to 0.1).
            assert row[f"ratio_{cache}"] == pytest.approx(ours["img_s"] / ref["img_s"], abs=0.01)
            assert row[f"ratio_{cache}_per_core"] == pytest.approx(ours["img_per_core_s"] / ref["img_per_core_s"],
                                                                   abs=0.01)


def test_the_loader_profile_runs(tmp_path):
    run("profile_loader.py", tmp_path, "--sizes", "64", "--samples", "8", "--batch-size", "4",
        "--out", str(tmp_path / "profile.md"))
    text = (tmp_path / "profile.md").read_text()
    assert "| stage | yolotrain 64 | reference 64 |" in text
    assert "| JPEG decode |" in text and "| **total** |" in text and "- 64 px: reading and decoding" in text


def test_the_scaling_benchmark_runs(tmp_path):
    run("bench_scaling.py", tmp_path, "--img-size", "64", "--dataset-sizes", "20", "40", "--out-dir", str(tmp_path))
    report = json.loads((tmp_path / "scaling.json").read_text())
    assert [row["data"] for row in report["loader"]] == ["coco128", "coco128 upscaled 4x"]
    big = report["loader"][1]
    assert big["median_long_side"] >= 4 * 400 and big["images"] == 8
    for key in ("reference_none", "reference_none_float", "yolotrain_none", "yolotrain_none_one_thread",
                "yolotrain_none_full_decode", "reference_ram", "reference_ram_float", "yolotrain_ram",
                "yolotrain_ram_one_thread"):
        assert big[key]["img_s"] > 0
    assert [row["images"] for row in report["datasets"]] == [20, 40]
    for row in report["datasets"]:
        for tool in ("reference", "yolotrain"):
            assert row[f"{tool}_first"]["images"] == row[f"{tool}_cached"]["images"] == row["images"]
            assert row[f"{tool}_cache_bytes"] > 0
    text = (tmp_path / "scaling.md").read_text()
    assert "| coco128 upscaled 4x (8 images) |" in text and "Reading:" in text and "| 40 | yolotrain |" in text
    # A second run of one dataset size replaces that row alone; a loader-only run keeps every dataset row.
    run("bench_scaling.py", tmp_path, "--no-loader", "--dataset-sizes", "20", "--out-dir", str(tmp_path))
    again = json.loads((tmp_path / "scaling.json").read_text())
    assert again["loader"] == report["loader"] and [row["images"] for row in again["datasets"]] == [20, 40]
    assert again["datasets"][1] == report["datasets"][1] and "--no-loader" in again["datasets"][0]["made_by"]["command"]
    run("bench_scaling.py", tmp_path, "--img-size", "64", "--no-datasets", "--out-dir", str(tmp_path))
    last = json.loads((tmp_path / "scaling.json").read_text())
    assert last["datasets"] == again["datasets"] and "--no-datasets" in last["loader_made_by"]["command"]
    assert "The 20-image rows: made by" in (tmp_path / "scaling.md").read_text()
