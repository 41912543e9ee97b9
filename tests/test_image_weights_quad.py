"""``--image-weights`` (images drawn by the weights of their classes, seeded, shared between processes,
resumed exactly) and ``--quad`` (batches merged by four as the reference's ``collate_fn4``)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import COCO128, coco128_subset
from safetensors.torch import load_file
from test_train import run_cli

from yolotrain import train
from yolotrain.checkpoint import read_checkpoint
from yolotrain.data.classify import write_shape_crops
from yolotrain.data.loaders import (
    DataConfig,
    EpochBatchSampler,
    build_loaders,
    class_weights,
    image_weights,
    quad_batch,
)
from yolotrain.data.sources import resolve_source
from yolotrain.data.verify import verify_split
from yolotrain.settings import ConfigError

TINY = {"img_size": 64, "batch_size": 4, "workers": 0, "device": "cpu", "autoanchor": False}


def imbalanced_labels(n: int = 60, nc: int = 5, seed: int = 0) -> list[np.ndarray]:
    """Per-image label rows (class, box) where class 0 is common and the others rare; some images empty."""
    rng = np.random.default_rng(seed)
    labels = []
    for _ in range(n):
        count = int(rng.integers(0, 5))
        classes = rng.choice(nc, size=count, p=[0.7, 0.15, 0.08, 0.05, 0.02])
        labels.append(np.concatenate((classes[:, None], rng.random((count, 4))), 1).astype(np.float32))
    return labels


@pytest.fixture(scope="module")
def train_labels(tmp_path_factory) -> tuple[list[np.ndarray], int]:
    """coco128's first 64 images' labels when the shared data is there, else generated imbalanced ones."""
    if not (COCO128 / "images").is_dir():
        return imbalanced_labels(), 5
    data = coco128_subset(tmp_path_factory.mktemp("coco"), 64)
    index = verify_split(resolve_source(data).train, 80, "train")
    return index.labels, 80


def sampler_over(labels: list[np.ndarray], batch_size: int = 8, seed: int = 0, rank: int = 0,
                 world_size: int = 1) -> EpochBatchSampler:
    dataset = type("Labels", (), {"rect": False, "epoch": 0, "mosaic": False, "__len__": lambda self: len(labels)})()
    return EpochBatchSampler(dataset, batch_size, True, seed, rank, world_size)


def epoch_indices(sampler: EpochBatchSampler, epoch: int) -> list[int]:
    sampler.dataset.epoch = epoch
    return [i for batch in sampler for i, _, _ in batch]


def test_weights_equal_the_references(reference, train_labels):
    from yolov5.utils.general import labels_to_class_weights, labels_to_image_weights

    labels, nc = train_labels
    maps = np.random.default_rng(1).random(nc) * 0.8
    model_class_weights = labels_to_class_weights(labels, nc) * nc  # as train.py attaches them
    expected = labels_to_image_weights(labels, nc=nc, class_weights=model_class_weights.numpy() * (1 - maps) ** 2 / nc)
    assert np.array_equal(class_weights(labels, nc), labels_to_class_weights(labels, nc).numpy())
    assert np.array_equal(image_weights(labels, nc, maps), expected)
    assert np.array_equal(image_weights(labels, nc), labels_to_image_weights(labels, nc, model_class_weights.numpy()
                                                                            * (1 - np.zeros(nc)) ** 2 / nc))


def test_draws_follow_the_weights(reference, train_labels):
    from yolov5.utils.general import labels_to_class_weights, labels_to_image_weights

    labels, nc = train_labels
    weights = labels_to_image_weights(labels, nc=nc, class_weights=labels_to_class_weights(labels, nc).numpy())
    sampler = sampler_over(labels)
    sampler.image_weights = image_weights(labels, nc)
    counts = np.bincount(np.concatenate([epoch_indices(sampler, e) for e in range(400)]), minlength=len(labels))
    frequency, expected = counts / counts.sum(), weights / weights.sum()
    assert counts[expected == 0].sum() == 0  # images without labels are never drawn, as in the reference
    assert np.abs(frequency - expected).max() < 0.01
    assert counts[np.argmax(expected)] > 2 * counts[expected > 0].min()  # rare classes' images are favoured


def test_same_seed_same_draw_other_epoch_or_seed_another(train_labels):
    labels, nc = train_labels
    draws = {}
    for seed, epoch in ((0, 0), (0, 0), (0, 1), (1, 0)):
        sampler = sampler_over(labels, seed=seed)
        sampler.image_weights = image_weights(labels, nc)
        draws.setdefault((seed, epoch), []).append(epoch_indices(sampler, epoch))
    assert draws[0, 0][0] == draws[0, 0][1] and len(draws[0, 0][0]) == len(labels)
    assert draws[0, 0][0] != draws[0, 1][0] and draws[0, 0][0] != draws[1, 0][0]


def test_processes_take_disjoint_shares_of_one_draw(train_labels):
    labels, nc = train_labels
    whole = sampler_over(labels, batch_size=8)
    whole.image_weights = image_weights(labels, nc)
    shares = []
    for rank in range(2):
        sampler = sampler_over(labels, batch_size=8, rank=rank, world_size=2)
        sampler.image_weights = image_weights(labels, nc)
        sampler.dataset.epoch = 3
        shares.append([[i for i, _, _ in batch] for batch in sampler])
    whole.dataset.epoch = 3
    for batch, first, second in zip(whole, *shares):
        assert [i for i, _, _ in batch] == first + second  # each position of the draw on exactly one process


def test_no_weighted_image_draws_uniformly():
    labels = [np.zeros((0, 5), np.float32)] * 6
    sampler = sampler_over(labels)
    sampler.image_weights = image_weights(labels, 2)
    assert len(epoch_indices(sampler, 0)) == 6


def reference_quad(reference, imgs: torch.Tensor, targets: torch.Tensor, seed: int):
    """The reference's collate_fn4 on the same images and targets, and the choices its ``random`` made."""
    from yolov5.utils.dataloaders import LoadImagesAndLabels

    batch = [(imgs[i], targets[targets[:, 0] == i].clone(), f"{i}.jpg", None) for i in range(len(imgs))]
    random.seed(seed)
    upsample = np.array([random.random() < 0.5 for _ in range(len(imgs) // 4)])
    random.seed(seed)
    return LoadImagesAndLabels.collate_fn4(batch)[:2], upsample


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_quad_batches_equal_the_references(reference, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    imgs = (torch.rand(8, 3, 32, 48, generator=gen) * 255).to(dtype)
    counts = torch.tensor([2, 0, 1, 3, 1, 2, 0, 1])
    targets = torch.cat((torch.repeat_interleave(torch.arange(8), counts).float()[:, None],
                         torch.randint(0, 3, (int(counts.sum()), 1), generator=gen).float(),
                         torch.rand(int(counts.sum()), 4, generator=gen)), 1)
    (ref_imgs, ref_targets), upsample = reference_quad(reference, imgs, targets, seed)
    ours_imgs, ours_targets = quad_batch(imgs, targets, upsample)
    assert ours_imgs.shape == (2, 3, 64, 96) and ours_imgs.dtype == dtype
    assert torch.equal(ours_imgs, ref_imgs)
    assert torch.equal(ours_targets, ref_targets)


def test_both_quad_branches_are_compared(reference):
    choices = np.concatenate([reference_quad(reference, torch.zeros(8, 3, 4, 4), torch.zeros(0, 6), seed)[1]
                              for seed in range(4)])
    assert choices.any() and not choices.all()  # the seeds above exercise upsampling and tiling


def test_a_short_last_quad_group_repeats_the_batchs_first_images():
    imgs = torch.arange(5, dtype=torch.float32).view(5, 1, 1, 1).expand(5, 3, 2, 2).contiguous()
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.5, 0.5], [4, 0, 0.25, 0.25, 0.25, 0.25]])
    merged, rows = quad_batch(imgs, targets, np.array([False, False]))
    assert merged.shape == (2, 3, 4, 4)
    assert merged[1, 0, :2, :2].eq(4).all() and merged[1, 0, 2:, :2].eq(0).all()  # image 4, then image 0 below it
    assert rows.tolist() == [[0, 1, 0.25, 0.25, 0.25, 0.25], [1, 0, 0.125, 0.125, 0.125, 0.125],
                             [1, 1, 0.25, 0.75, 0.25, 0.25]]  # image 0's label again, in the lower-left tile


@pytest.mark.parametrize("augment_device", ["loader", "cpu"])
def test_quad_loader_gives_a_quarter_of_the_images_at_twice_the_size(tiny_data, augment_device):
    config = DataConfig(path=str(tiny_data), img_size=64, batch_size=8, workers=0, quad=True,
                        augment_device=augment_device)
    from yolotrain.data.augment import AugmentConfig
    loaders = build_loaders(config, AugmentConfig(), seed=0)
    first = [(imgs.clone(), targets.clone()) for imgs, targets in loaders.train]
    again = [(imgs, targets) for imgs, targets in loaders.train]
    assert len(first) == 1 and first[0][0].shape == (2, 3, 128, 128)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    assert next(iter(loaders.val)).imgs.shape[0] == 4  # validation batches (4 images) are not merged


def test_image_weights_with_rect_is_refused_in_one_line(tiny_data):
    with pytest.raises(ValueError, match="image_weights draws training images by class"):
        build_loaders(DataConfig(path=str(tiny_data), img_size=64, batch_size=4, workers=0, rect=True,
                                 image_weights=True))


@pytest.mark.parametrize("flag", ["--image-weights", "--quad"])
def test_training_with_the_option_completes(tiny_data, tmp_path, flag):
    run = run_cli("train", "--data", str(tiny_data), "--epochs", "1", "--img", "64", "--batch", "4", "--workers",
                  "0", "--device", "cpu", "--noautoanchor", flag, "--project", str(tmp_path), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "exp" / "weights" / "last.safetensors").is_file()


@pytest.mark.slow
def test_resumed_image_weights_run_ends_where_the_whole_run_ends(tiny_data, tmp_path):
    """The validation's per-class mAPs that weight the next epoch's draw come back with the checkpoint
    (four short runs: a slow test)."""
    settings = dict(data=str(tiny_data), epochs=2, image_weights=True, **TINY)
    drawn = {}

    def record(trainer, epoch):
        drawn[(trainer.save_dir.parent.name, epoch)] = trainer.train_sampler.image_weights.tolist()

    whole = train(project=str(tmp_path / "whole"), callbacks={"on_train_epoch_start": record}, **settings)

    def stop_after_first_epoch(trainer, epoch, *rest):
        trainer.stop = True

    cut = train(project=str(tmp_path / "cut"), callbacks={"on_fit_epoch_end": stop_after_first_epoch}, **settings)
    maps = read_checkpoint(cut.last).metadata["class_maps"]
    assert maps is not None and len(maps) == 2
    shutil.copytree(tmp_path / "cut", tmp_path / "edited")
    resumed = train(resume=str(cut.last), callbacks={"on_train_epoch_start": record})
    assert resumed.epochs_run == 1
    assert drawn["cut", 1] == drawn["whole", 1]  # the resumed epoch's draw
    a, b = load_file(f"{whole.last}.safetensors"), load_file(f"{resumed.last}.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # The draw follows the recorded mAPs, not a fresh start's zeros: other recorded values, another draw.
    document = tmp_path / "edited" / "exp" / "weights" / "last.json"
    saved = json.loads(document.read_text())
    saved["class_maps"] = [0.25, 0.9]
    document.write_text(json.dumps(saved))
    labels = []
    train(resume=str(document), callbacks={"on_train_epoch_start": lambda trainer, epoch: (
        record(trainer, epoch), labels.extend(trainer.train_set.labels))})
    assert np.array_equal(drawn["edited", 1], image_weights(labels, 2, np.array([0.25, 0.9])))
    assert not np.array_equal(drawn["edited", 1], image_weights(labels, 2))


def test_two_processes_train_with_image_weights_and_quad(tiny_data, tmp_path):
    """torchrun with 2 CPU processes (gloo): rank 0's per-class mAPs reach the other process before each draw."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "yolotrain", "train", "--data", str(tiny_data), "--img", "64", "--batch", "8",
                          "--epochs", "2", "--workers", "0", "--noautoanchor", "--image-weights", "--quad",
                          "--project", "runs"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "on 2 process(es)" in ddp.stdout
    assert read_checkpoint(tmp_path / "runs" / "exp" / "weights" / "last").metadata["class_maps"] is not None


def test_quad_with_segmentation_batches_is_refused_in_one_line(tiny_data):
    with pytest.raises(ValueError, match="quad merges detection batches"):
        build_loaders(DataConfig(path=str(tiny_data), img_size=64, batch_size=4, workers=0, quad=True), kind="masks")


@pytest.mark.parametrize("option", ["image_weights", "quad"])
def test_a_classifier_refuses_the_detection_batch_options(tmp_path, option):
    data = write_shape_crops(tmp_path / "crops", n_train=2, n_val=1)
    with pytest.raises(ConfigError, match=f"--{option.replace('_', '-')} applies to detection batches"):
        train(data=str(data), model="yolov5n-cls", epochs=1, project=str(tmp_path / "runs"), **{option: True}, **TINY)
