"""The anchor-free models (yolov8n, yolo11n-seg, yolov5nu) through everything else the detection and
segmentation tasks do: training with their loss and recipe, checkpoints, resume, fine-tuning from YOLOv5
weights, callbacks, freeze, tuning, AutoBatch, the doctor, tracking, the YOLO object and two processes."""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_train import run_cli

from yolotrain import YOLO, Yolov5, train
from yolotrain.callbacks import HOOKS
from yolotrain.checkpoint import CheckpointError, save_checkpoint
from yolotrain.cli import build_parser, train_settings
from yolotrain.data import generate_shapes_dataset
from yolotrain.data.shapes_video import generate_shapes_video
from yolotrain.engine import Trainer, resolve_config
from yolotrain.engine.autobatch import output_tensors
from yolotrain.interop import load_checkpoint
from yolotrain.model.anchor_free import AnchorFreeYolo
from yolotrain.track import TrackerConfig
from yolotrain.track.run import track
from yolotrain.tuning import tune
from yolotrain.tuning.evolve import evolve, reference_values
from yolotrain.tuning.space import default_space, evolution_limits

TINY = {"img_size": 64, "batch_size": 4, "workers": 0, "device": "cpu"}
DFL_KEY = "model.22.dfl.conv.weight"  # yolov8n's head is layer 22


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=8, n_val=4, img_size=64) / \
        "data.yaml"


def results(run: Path) -> list[dict[str, str]]:
    with (run / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def trained(shapes, tmp_path_factory):
    """A 1-epoch yolov8n run, validated, with a recording function on every hook; the final EMA
    model saved and the DFL weights of the model and its EMA after every step."""
    seen: dict = {"hooks": [], "dfl": []}

    def record(hook, trainer, *args):
        seen["hooks"].append(hook)
        if hook == "on_train_batch_end":
            seen.setdefault("criterion", type(trainer.criterion).__name__)
            seen["dfl"].append((trainer.model.state_dict()[DFL_KEY].clone(),
                                trainer.state.ema.module.state_dict()[DFL_KEY].clone()))
        if hook == "on_model_save" and args[2]:  # the final save
            # In the checkpoint's layout: training keeps the model channels-last.
            seen["final_ema"] = copy.deepcopy(trainer.state.ema.module).float().eval().to(
                memory_format=torch.contiguous_format)

    callbacks = {hook: (lambda *args, hook=hook: record(hook, *args)) for hook in HOOKS}
    result = train(data=str(shapes), model="yolov8n", epochs=1, project=str(tmp_path_factory.mktemp("runs")),
                   callbacks=callbacks, **TINY)
    return result, seen


def test_yolov8n_trains_with_its_loss_and_reports_its_parts(trained):
    result, seen = trained
    assert seen["criterion"] == "AnchorFreeLoss"
    training_hooks = set(HOOKS) - {"on_predict_start", "on_predict_image_end", "on_predict_end"}
    assert set(seen["hooks"]) == training_hooks
    assert seen["hooks"][:4] == ["on_pretrain_routine_start", "on_params_update", "on_pretrain_routine_end",
                                 "on_train_start"] and seen["hooks"][-2:] == ["on_train_end", "teardown"]
    rows = results(result.save_dir)
    assert list(rows[0])[:4] == ["epoch", "train_box", "train_cls", "train_dfl"]
    assert {"val_box", "val_cls", "val_dfl", "mAP50"} <= set(rows[0]) and not {"train_obj", "val_obj"} & set(rows[0])
    assert all(float(rows[-1][k]) > 0 for k in ("train_box", "train_cls", "train_dfl", "val_cls"))


def test_a_segmentation_model_trains_with_the_anchor_free_mask_loss(shapes, tmp_path):
    seen = {}

    def record(trainer, *rest):
        seen.setdefault("criterion", type(trainer.criterion).__name__)

    result = train(data=str(shapes), model="yolo11n-seg", epochs=1, project=str(tmp_path),
                   callbacks={"on_train_batch_end": record}, **TINY)
    assert seen["criterion"] == "AnchorFreeSegmentLoss"
    rows = results(result.save_dir)
    assert list(rows[0])[:5] == ["epoch", "train_box", "train_seg", "train_cls", "train_dfl"]
    assert {"val_box", "val_seg", "val_cls", "val_dfl", "mask_mAP50"} <= set(rows[0])
    assert float(rows[0]["train_seg"]) > 0 and float(rows[0]["val_seg"]) > 0
    model, meta = load_checkpoint(result.last)
    assert isinstance(model, AnchorFreeYolo) and (model.task, model.version, meta["family"]) == \
        ("segment", "yolo11n-seg", "anchor_free")


def resolved(*args: str):
    return resolve_config(**train_settings(build_parser().parse_args(["train", *args])))


def test_the_anchor_free_recipe_applies_unless_a_setting_is_given():
    v8 = resolved("--model", "yolov8n")
    assert (v8.loss.box, v8.loss.cls, v8.loss.dfl, v8.augment.close_mosaic) == (7.5, 0.5, 1.5, 10)
    v5 = resolved("--model", "yolov5n")
    assert (v5.loss.box, v5.augment.close_mosaic) == (0.05, 0)
    given = resolve_config(model="yolov8n", box=0.2, close_mosaic=3)
    assert (given.loss.box, given.loss.cls, given.augment.close_mosaic) == (0.2, 0.5, 3)


def test_the_checkpoint_reloads_as_the_anchor_free_model_it_saved(trained, shapes):
    result, seen = trained
    model, meta = load_checkpoint(result.last)
    saved = json.loads(result.last.with_suffix(".json").read_text())
    assert isinstance(model, AnchorFreeYolo) and saved["family"] == "anchor_free" and saved["version"] == "yolov8n"
    assert meta["names"] == ["circle", "rectangle"] and model.head.nc == 2
    imgs = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), seen["final_ema"].state_dict().values()))
    with torch.no_grad():
        assert torch.equal(model(imgs), seen["final_ema"](imgs))


@pytest.mark.parametrize(("edit", "field"), [
    ({"version": "yolov8q"}, "version"),
    ({"version": "custom"}, "cfg"),
    ({"version": "custom", "cfg": {"backbone": [[-1, 1, "NoSuchLayer", [16]]], "head": []}}, "cfg"),
])
def test_an_edited_anchor_free_checkpoint_is_one_line(trained, tmp_path, edit, field):
    result, _ = trained
    for suffix in (".json", ".safetensors"):
        shutil.copy(result.last.with_suffix(suffix), tmp_path / f"edited{suffix}")
    json_path = tmp_path / "edited.json"
    json_path.write_text(json.dumps({**json.loads(json_path.read_text()), **edit}))
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path / "edited")
    assert field in str(error.value) and "\n" not in str(error.value)


@pytest.mark.slow
def test_a_resumed_anchor_free_run_ends_where_the_whole_run_ends(shapes, tmp_path):
    settings = dict(data=str(shapes), model="yolov8n", epochs=2, val=False, **TINY)
    whole = train(project=str(tmp_path / "whole"), **settings)

    def stop_after_first_epoch(trainer, epoch, *rest):
        trainer.stop = True

    cut = train(project=str(tmp_path / "cut"), callbacks={"on_fit_epoch_end": stop_after_first_epoch}, **settings)
    assert cut.epochs_run == 1
    resumed = train(resume=str(cut.last))
    assert resumed.epochs_run == 1
    a, b = load_file(f"{whole.last}.safetensors"), load_file(f"{resumed.last}.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert results(whole.save_dir)[-1]["train_dfl"] == results(resumed.save_dir)[-1]["train_dfl"]


def test_yolov5_weights_start_a_yolov5u_model_but_its_head(shapes, tmp_path, capsys):
    """yolov5nu has yolov5n's backbone and neck (layers 0-23): every tensor but the head's transfers."""
    torch.manual_seed(3)
    source = Yolov5("n", num_classes=2, names=["circle", "rectangle"])
    save_checkpoint(tmp_path / "yolov5n", source)
    trainer = Trainer(resolve_config(data=str(shapes), model="yolov5nu", pretrained=str(tmp_path / "yolov5n"),
                                     project=str(tmp_path / "runs"), epochs=1, **TINY))
    trainer.setup()
    ours, theirs = trainer.model.state_dict(), source.state_dict()
    assert isinstance(trainer.model, AnchorFreeYolo)
    body = [k for k in ours if not k.startswith("model.24.")]
    assert set(body) == {k for k in theirs if not k.startswith("model.24.")}
    assert all(torch.equal(ours[k], theirs[k]) for k in body)
    assert f"Transferred {len(body)}/{len(ours)} tensors from" in capsys.readouterr().out


def test_freeze_keeps_the_frozen_layers_of_an_anchor_free_model(shapes, tmp_path, capsys):
    seen = {}

    def record_start(trainer, *rest):
        seen["start"] = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    result = train(data=str(shapes), model="yolov8n", epochs=1, val=False, freeze=(10,), project=str(tmp_path),
                   callbacks={"on_train_start": record_start}, **TINY)
    assert "Freezing layers 0, 1, 2, 3, 4, 5, 6, 7, 8, 9:" in capsys.readouterr().out
    end = load_file(f"{result.last}.safetensors")
    weights = [k for k in seen["start"] if k.endswith(".weight") and "bn" not in k]
    frozen = [k for k in weights if int(k.split(".")[1]) < 10]
    assert frozen and all(torch.equal(end[f"model.{k}"], seen["start"][k]) for k in frozen)
    assert any(not torch.equal(end[f"model.{k}"], seen["start"][k]) for k in weights if k not in frozen)


def test_the_dfl_weights_stay_the_bin_indices(trained):
    """The DFL convolution is the expectation over the 16 bins: a constant no step, decay or EMA changes."""
    result, seen = trained
    bins = torch.arange(16, dtype=torch.float32).view(1, 16, 1, 1)
    assert seen["dfl"] and all(torch.equal(m.float(), bins) and torch.equal(e.float(), bins) for m, e in seen["dfl"])
    saved = load_file(f"{result.last}.safetensors")
    assert torch.equal(saved[f"model.{DFL_KEY}"], bins) and torch.equal(saved[f"ema.{DFL_KEY}"], bins)
    model, _ = load_checkpoint(result.last)
    assert not model.model[22].dfl.conv.weight.requires_grad


def test_the_search_space_of_an_anchor_free_model_holds_its_loss_gains():
    """YOLOv5's box limits (0.02-0.2) would clip yolov8n's 7.5: tune and evolve take the family's ranges."""
    v8 = {p.name: (p.low, p.high) for p in default_space("yolov8n")}
    assert (v8["box"], v8["cls"], v8["dfl"]) == ((1.0, 20.0), (0.1, 4.0), (0.4, 12.0))
    assert default_space("yolov5n") == default_space() and "dfl" not in {p.name for p in default_space()}
    for end in (0, 1):
        resolve_config(model="yolov8n", **{name: bounds[end] for name, bounds in v8.items()})
    assert reference_values(resolve_config(model="yolov8n"))["box"] == 7.5
    assert reference_values(resolve_config(model="yolov5n"))["box"] == 0.05
    assert evolution_limits("yolo11n-seg")["box"] == (1.0, 20.0) and evolution_limits()["box"] == (0.02, 0.2)


def test_tune_runs_a_trial_of_an_anchor_free_model(shapes, tmp_path):
    """The first trial trains the settings as given: the family's recipe, inside the default space."""
    result = tune(data=str(shapes), model="yolov8n", project=str(tmp_path), trials=1, epochs=1, plots=False,
                  tensorboard=False, **TINY)
    assert result.trials["COMPLETE"] == 1 and result.best_fitness is not None
    trial = result.save_dir / "trials" / "trial0"
    assert "train_dfl" in results(trial)[0]  # the anchor-free loss trained it
    trained_with = yaml.safe_load((trial / "config.yaml").read_text())["loss"]
    assert (trained_with["box"], trained_with["cls"], trained_with["dfl"]) == (7.5, 0.5, 1.5)


def test_evolve_trains_a_generation_of_an_anchor_free_model_with_its_gains(shapes, tmp_path):
    result = evolve(1, data=str(shapes), model="yolov8n", project=str(tmp_path), plots=False, tensorboard=False,
                    epochs=1, **TINY)
    assert result.generations == 1
    with (result.save_dir / "evolve.csv").open(newline="") as f:
        row = {k.strip(): v for k, v in next(csv.DictReader(f)).items()}
    assert (float(row["box"]), float(row["cls"])) == (7.5, 0.5)
    assert "train_dfl" in results(result.save_dir / "generations" / "gen0")[0]


def test_autobatch_probes_an_anchor_free_model(shapes, tmp_path, capsys):
    """Off CUDA, the fallback line; the probe's forward + backward runs on a detector's and a segmenter's
    training outputs."""
    trainer = Trainer(resolve_config(data=str(shapes), model="yolov8n", device="cpu", img_size=64, autobatch=0.7,
                                     workers=0, project=str(tmp_path / "runs")))
    trainer.setup()
    assert "AutoBatch needs CUDA (this run is on cpu): using batch 16\n" in capsys.readouterr().out
    for arch in ("yolov8n", "yolo11n-seg"):
        model = AnchorFreeYolo(arch, num_classes=2).train()
        outputs = output_tensors(model(torch.zeros(2, 3, 64, 64)))
        sum(o.float().sum() for o in outputs).backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_first_anchor_free_step_under_the_doctor_is_clean(shapes, tmp_path, capsys):
    result = Trainer(resolve_config(data=str(shapes), model="yolov8n", epochs=1, val=False, plots=False,
                                    doctor=True, project=str(tmp_path), **TINY)).fit()
    assert (result.last.parent / "last.json").is_file()
    assert "modified by" not in capsys.readouterr().err


def test_an_anchor_free_model_tracks_the_shapes_video(trained, tmp_path):
    result, _ = trained
    clip = generate_shapes_video(tmp_path / "data", frames=6)
    tracker = TrackerConfig(tracker_type="botsort", track_high_thresh=0.005, track_low_thresh=0.001,
                            new_track_thresh=0.005, fuse_score=False)
    tracked = track(result.last, clip / "shapes.mp4", tracker, save_dir=tmp_path / "run", conf=0.001, max_det=6,
                    img_size=64, device="cpu")
    assert len(tracked) == 6 and sum(len(r.ids) for r in tracked) > 0
    assert all(len(r.ids) == len(r.boxes) == len(r.scores) for r in tracked)
    assert (tmp_path / "run" / "mot" / "shapes.txt").read_text().strip()


def test_the_yolo_object_builds_trains_validates_and_predicts_an_anchor_free_model(shapes, tmp_path):
    from_yaml = YOLO("yolov8n.yaml")  # not a file: the published architecture
    assert isinstance(from_yaml.model, AnchorFreeYolo) and from_yaml.model.arch_name == "yolov8n"
    model = YOLO("yolov8n")
    assert isinstance(model.model, AnchorFreeYolo) and len(model.names) == 80
    model.train(data=str(shapes), epochs=1, val=False, project=str(tmp_path / "runs"), **TINY)
    assert isinstance(model.model, AnchorFreeYolo) and model.names == ["circle", "rectangle"]
    metrics = model.val(img_size=64, batch_size=4, workers=0, device="cpu", plots=False,
                        project=str(tmp_path / "val"))
    assert 0 <= metrics.map50 <= 1
    images = sorted((shapes.parent / "images" / "val").iterdir())[:2]
    predicted = model.predict([str(p) for p in images], img_size=64, conf=0.001, device="cpu",
                              project=str(tmp_path / "predict"))
    assert len(predicted) == 2 and all(r.boxes.shape[-1] >= 4 for r in predicted)


@pytest.mark.slow
def test_two_process_anchor_free_step_equals_one_process_step(shapes, tmp_path):
    """torchrun with 2 CPU processes (gloo) on yolov8n, as tests/test_train.py checks for yolov5n: one step on
    a global batch of 2 identical, unaugmented pictures equals one process's step."""
    source = sorted((shapes.parent / "images" / "train").iterdir())[0]
    label = shapes.parent / "labels" / "train" / (source.stem + ".txt")
    for split in ("train", "val"):
        (tmp_path / "twin" / "images" / split).mkdir(parents=True)
        (tmp_path / "twin" / "labels" / split).mkdir(parents=True)
        for name in ("a", "b"):
            (tmp_path / "twin" / "images" / split / f"{name}{source.suffix}").write_bytes(source.read_bytes())
            (tmp_path / "twin" / "labels" / split / f"{name}.txt").write_text(label.read_text())
    (tmp_path / "twin" / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\n"
                                                 "names: [circle, rectangle]\n")
    (tmp_path / "hyp.yaml").write_text("mosaic: 0\nfliplr: 0\nhsv_h: 0\nhsv_s: 0\nhsv_v: 0\ntranslate: 0\n"
                                       "scale: 0\nwarmup_epochs: 0\n")
    # SGD: the recipe's automatic choice here, AdamW, turns a gradient that is zero up to rounding into a whole
    # step of either sign, so that the two runs would differ by 2 * lr0 on such weights.
    args = ["train", "--model", "yolov8n", "--data", "twin/data.yaml", "--img", "64", "--batch", "2",
            "--nominal-batch", "2", "--epochs", "1", "--workers", "0", "--hyp", "hyp.yaml", "--project", "runs",
            "--no-val", "--amp", "off", "--optimizer", "SGD"]
    single = run_cli(*args, "--name", "single", cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "yolotrain", *args, "--name", "ddp"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "on 2 process(es)" in ddp.stdout
    a = load_file(str(tmp_path / "runs" / "single" / "weights" / "last.safetensors"))
    b = load_file(str(tmp_path / "runs" / "ddp" / "weights" / "last.safetensors"))
    # Parameters; BatchNorm running variances differ by design (unbiased over fewer values per rank).
    model_keys = [k for k in a if k.startswith("model.") and not k.endswith(("running_var", "num_batches_tracked"))]
    diffs = {k: (a[k] - b[k]).abs().max().item() for k in model_keys}
    assert max(diffs.values()) <= 1e-5, sorted(diffs.items(), key=lambda kv: -kv[1])[:3]
    model, _ = load_checkpoint(tmp_path / "runs" / "ddp" / "weights" / "last")
    assert isinstance(model, AnchorFreeYolo) and model.num_classes == 2
