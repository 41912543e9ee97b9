"""Building a batch's samples on threads when the loader has no worker processes: the batches are the same as one
thread's for every task, the samples really are built side by side, errors and loader processes are as before."""

import multiprocessing
import pickle
import threading

import numpy as np
import pytest
import torch

from yolotrain.data.augment import AugmentConfig
from yolotrain.data.classify import build_classify_loaders, write_shape_crops
from yolotrain.data.dataset import DetectionDataset, ImageReadError
from yolotrain.data.loaders import DataConfig, build_loaders
from yolotrain.data.sample_threads import MAX_DEFAULT_THREADS, available_cpus, default_sample_threads, map_samples
from yolotrain.data.shapes import generate_shapes_dataset

MIXED = AugmentConfig(mixup=0.5, copy_paste=0.5)


def batches(loader, epochs: int = 2) -> list:
    """Every batch of ``epochs`` epochs as tensors (a batch's fields in order)."""
    out = []
    for epoch in range(epochs):
        loader.dataset.set_epoch(epoch)
        out += [[field.clone() if isinstance(field, torch.Tensor) else field for field in batch] for batch in loader]
    return out


def assert_same_batches(one: list, other: list) -> None:
    assert len(one) == len(other) > 0
    for a, b in zip(one, other):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, torch.Tensor):
                assert torch.equal(x, y)
            else:
                assert x == y


@pytest.mark.parametrize(("labels", "kind"), [("polygons", "boxes"), ("polygons", "masks"), ("pose", "keypoints"),
                                              ("obb", "rotated")])
def test_threads_give_the_batches_of_one_thread(tmp_path, labels, kind):
    root = generate_shapes_dataset(tmp_path, n_train=10, n_val=5, img_size=64, labels=labels)
    made = {}
    for threads in (1, 3):
        config = DataConfig(path=str(root / "data.yaml"), img_size=64, batch_size=4, workers=0, cache_mb=0,
                            loader_threads=threads)
        loaders = build_loaders(config, MIXED, kind=kind)
        assert loaders.train.dataset.threads == loaders.val.dataset.threads == threads
        made[threads] = batches(loaders.train) + batches(loaders.val, 1)
    assert_same_batches(made[1], made[3])


def test_classification_crops_are_the_same_on_threads(tmp_path):
    root = write_shape_crops(tmp_path / "crops", n_train=6, n_val=3)
    made = []
    for threads in (1, 3):
        loaders = build_classify_loaders(root, img_size=32, batch_size=4, workers=0)
        for loader in (loaders.train, loaders.val):
            loader.dataset.threads = threads
        made.append(batches(loaders.train) + batches(loaders.val, 1))
    assert_same_batches(*made)


class MeetingDataset(DetectionDataset):
    """Each sample waits until another one is being built at the same time (it fails after a timeout)."""

    meeting = threading.Barrier(2, timeout=10)

    def __getitem__(self, key):
        self.meeting.wait()
        return super().__getitem__(key)


def test_samples_of_a_batch_are_built_side_by_side(tmp_path):
    root = generate_shapes_dataset(tmp_path, n_train=4, n_val=2, img_size=64)
    index = build_loaders(DataConfig(path=str(root / "data.yaml"), img_size=64, batch_size=4, workers=0),
                          None, splits=("train",)).train_index
    dataset = MeetingDataset(index, 64, 4, augment=True, threads=2)
    samples = dataset.__getitems__([0, 1, 2, 3])  # would time out, one sample at a time
    assert [img.shape for img, _ in samples] == [(64, 64, 3)] * 4


def test_an_unreadable_image_fails_the_batch_with_its_name(tmp_path):
    root = generate_shapes_dataset(tmp_path, n_train=6, n_val=2, img_size=64)
    config = DataConfig(path=str(root / "data.yaml"), img_size=64, batch_size=6, workers=0, cache_mb=0,
                        loader_threads=3)
    loader = build_loaders(config, AugmentConfig(mosaic=0.0), splits=("train",)).train
    gone = loader.dataset.im_files[2]
    gone.unlink()
    with pytest.raises(ImageReadError, match=f"cannot read image {gone}"):
        next(iter(loader))


def test_the_default_is_one_thread_with_loader_processes_else_a_share_of_the_cpus(tmp_path):
    cpus = available_cpus()
    assert default_sample_threads(2) == 1
    assert default_sample_threads(0) == max(1, min(MAX_DEFAULT_THREADS, cpus))
    assert default_sample_threads(0, world_size=cpus * 2) == 1
    root = generate_shapes_dataset(tmp_path, n_train=4, n_val=2, img_size=64)
    loaders = build_loaders(DataConfig(path=str(root / "data.yaml"), img_size=64, batch_size=2, workers=1), None)
    assert loaders.train.dataset.threads == loaders.val.dataset.threads == 1


def test_a_dataset_with_its_image_cache_goes_to_loader_processes(tmp_path):
    root = generate_shapes_dataset(tmp_path, n_train=4, n_val=2, img_size=64)
    dataset = build_loaders(DataConfig(path=str(root / "data.yaml"), img_size=64, batch_size=2, workers=0,
                                       cache="ram"), None, splits=("train",)).train.dataset
    copy = pickle.loads(pickle.dumps(dataset))
    assert np.array_equal(copy[0][0], dataset[0][0])
    copy._cache.put(99, np.zeros((2, 2, 3), np.uint8))  # the copy's cache has a working lock of its own
    assert copy._cache.get(99) is not None and dataset._cache.get(99) is None


def _squares_in_a_child(queue) -> None:
    queue.put(map_samples(lambda k: k * k, [1, 2, 3, 4], 2))


def test_a_forked_process_makes_a_pool_of_its_own():
    assert map_samples(lambda k: k + 1, [1, 2, 3], 2) == [2, 3, 4]  # the parent's pool exists before the fork
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_squares_in_a_child, args=(queue,))
    child.start()
    assert queue.get(timeout=30) == [1, 4, 9, 16]
    child.join(30)
    assert child.exitcode == 0
