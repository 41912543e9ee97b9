"""Shared fixtures: the reference implementation (optional oracle), the shared data folder, a tiny generated
dataset and an untrained model."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from yolotrain import Yolov5
from yolotrain.checkpoint import save_checkpoint
from yolotrain.data import generate_shapes_dataset
from yolotrain.data.sources import link_subset
from yolotrain.model.anchor_free import AnchorFreeYolo
from yolotrain.model.classify import Classifier

# The doctor corpus tests' shared assertions get pytest's detailed failure messages.
pytest.register_assert_rewrite("doctor_corpus")
# The doctor's runs in these tests propose patches as read from the source (the corpus tests apply and run
# them themselves), not verified by a second run of each program, which would double every run's time;
# packages/inplace-doctor/tests/test_inplace_doctor_verify_fix.py tests the automatic verification.
os.environ.setdefault("INPLACE_DOCTOR_AUTO_VERIFY_S", "0")

try:  # the LiteRT environment runs only tests that need no hypothesis, and has none
    from hypothesis import settings as hypothesis_settings
    from hypothesis.configuration import set_hypothesis_home_dir
except ImportError:
    hypothesis_settings = None


def pytest_configure(config):
    """Hypothesis writes nothing into the working folder (the checkout): no example database, and its
    other files (a cache of the constants in test modules, written as they are collected) in a temporary
    folder removed at the end. Under CI (``CI`` set, as CI sets it) the property tests are derandomized:
    every machine draws the same examples, so a submission's verdict does not depend on the draw; locally
    they explore new examples each run. ``YOLOTRAIN_HYPOTHESIS_PROFILE`` picks a profile by name."""
    if hypothesis_settings is None:
        return
    hypothesis_settings.register_profile("no-database", database=None)
    hypothesis_settings.register_profile("ci", database=None, derandomize=True, print_blob=True)
    default = "ci" if os.environ.get("CI") else "no-database"
    hypothesis_settings.load_profile(os.environ.get("YOLOTRAIN_HYPOTHESIS_PROFILE", default))
    config.hypothesis_home = Path(tempfile.mkdtemp(prefix="yolotrain-hypothesis-"))
    set_hypothesis_home_dir(config.hypothesis_home)


def pytest_sessionfinish(session, exitstatus):
    """torch._dynamo's state is dropped while the interpreter still stands (tests compile training, and the
    doctor's tests, collected in the same session, run compiled programs). Each code object dynamo compiled
    holds a cleanup hook that fires when the object is collected; at the interpreter's shutdown the hook
    finds dynamo's module torn down and prints an "Exception ignored" traceback. ``reset()`` alone leaves
    the hooks: dropping the weak references to those code objects leaves none to fire."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
        dynamo.utils.CleanupManager.instance.clear()


def pytest_unconfigure(config):
    if hypothesis_settings is not None:
        set_hypothesis_home_dir(None)
        shutil.rmtree(config.hypothesis_home, ignore_errors=True)

SHARED = Path(__file__).resolve().parents[2] / "shared"
COCO128 = SHARED / "datasets" / "coco128"
YOLOV5N_WEIGHTS = SHARED / "weights" / "yolov5n.pt"


def coco128_subset(root: Path, n: int, coco128: Path = COCO128) -> Path:
    """A dataset of the first ``n`` coco128 images (symlinks) with its YAML, so no tool writes caches
    into the shared folder."""
    return link_subset(coco128 / "data.yaml", root, n)


@pytest.fixture(scope="session", autouse=True)
def _user_cache(tmp_path_factory):
    """The library's user cache folder (generated datasets, label caches of read-only data, weights by
    name) under the session's temporary folder, never the home folder; subprocesses inherit it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("YOLOTRAIN_CACHE", str(tmp_path_factory.mktemp("yolotrain-cache")))
        yield


@pytest.fixture(scope="session")
def coco_mini(tmp_path_factory) -> Path:
    """The YAML of a copy of the ``coco_mini`` fixture: the label cache is written beside the labels, which
    must be a temporary folder, never the checkout."""
    root = tmp_path_factory.mktemp("fixtures") / "coco_mini"
    shutil.copytree(Path(__file__).parent / "fixtures" / "data" / "coco_mini", root)
    return root / "data.yaml"


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """The YAML of a generated shapes dataset (8 training, 4 validation images of 64 px), one per test module."""
    root = generate_shapes_dataset(root=tmp_path_factory.mktemp("shapes"), n_train=8, n_val=4, img_size=64)
    return root / "data.yaml"


@pytest.fixture(scope="module")
def model() -> Yolov5:
    """An untrained yolov5n for two classes (weights of seed 0) in eval mode, one per test module."""
    torch.manual_seed(0)
    return Yolov5("n", num_classes=2).eval()


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory) -> Path:
    """The checkpoint set of an untrained yolov5n for the shapes classes (weights of seed 0), one per module."""
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=2).eval()
    model.names = ["circle", "rectangle"]
    return save_checkpoint(tmp_path_factory.mktemp("weights") / "tiny", model)


@contextlib.contextmanager
def offline_ultralytics(tmp_path_factory) -> Iterator[ModuleType]:
    """The ``ultralytics`` package (the oracle of the anchor-free family and of the trackers), offline and writing its
    settings into a temporary folder while the context lasts; the test is skipped where it is not installed."""
    config_dir = tmp_path_factory.mktemp("ultralytics")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("YOLO_CONFIG_DIR", "ULTRALYTICS_CONFIG_DIR"):
            patch.setenv(name, str(config_dir))
        patch.setenv("YOLO_OFFLINE", "1")
        yield pytest.importorskip("ultralytics")


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """The PyPI ``yolov5`` package (the reference implementation), offline and writing only to a temp dir."""
    config_dir = str(tmp_path_factory.mktemp("yolov5-config"))
    os.environ.update(YOLO_OFFLINE="1", YOLO_CONFIG_DIR=config_dir, YOLOV5_CONFIG_DIR=config_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("yolov5", reason="reference implementation not installed (pip install '.[parity]')")
        import yolov5.models.yolo  # noqa: F401  (registers the reference model classes)
        import yolov5.utils.loss  # noqa: F401
    logging.getLogger("yolov5").setLevel(logging.WARNING)
    return sys.modules["yolov5"]


@pytest.fixture(scope="session")
def coco128() -> Path:
    if not (COCO128 / "images").is_dir():
        pytest.skip(f"shared dataset not found at {COCO128}")
    return COCO128


def untrained(arch: str, **head: object) -> AnchorFreeYolo:
    """An untrained model that detects something to compare: its BatchNorms given spread statistics (fresh ones make
    every layer's output nearly constant, so all boxes and scores tie) and its class scores spread around 0.5 (the
    published prior puts them near 1e-4, below any threshold)."""
    torch.manual_seed(0)
    model = AnchorFreeYolo(arch, num_classes=2, names=["circle", "rectangle"], **head).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.2)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.normal_(1, 0.3)
                module.bias.normal_(0, 0.3)
        for branch in model.head.cv3:
            branch[-1].bias.zero_()
    return model


def yolov5_segmenter() -> Yolov5:
    """A random YOLOv5 segmentation model whose prototypes are of order 1 (a random Proto's are ~1e-7)."""
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=3, names=["a", "b", "c"], task="segment").eval()
    with torch.no_grad():
        model.head.proto.cv3.bn.bias.copy_(torch.randn(32))
    return model


def yolov5_classifier() -> Classifier:
    """A classifier with spread BatchNorm statistics, so its logits differ from image to image."""
    torch.manual_seed(0)
    model = Classifier.from_name("yolov5n-cls", 2, ["circle", "rectangle"])
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean = torch.randn_like(module.running_mean) * 0.1
            module.running_var = torch.rand_like(module.running_var) + 0.5
    return model.eval()


def assert_scores_and_predicts_as_pytorch(model: torch.nn.Module, export_path: Path, data: Path, size: int,
                                          **runtime: object) -> None:
    """``val`` on the fixed-size export ``export_path`` scores as PyTorch's ``model`` does on the same square
    letterboxed batches (mAP50 and mAP to 1e-3), and ``predict`` on two of ``data``'s val images finds the same
    boxes (within 0.05 px), classes and names. ``runtime``: what loading the export needs (``trust_code``)."""
    from yolotrain import predict
    from yolotrain.eval import val

    ours = val(model, str(data), img_size=size, batch_size=4, workers=0, rect=False, verbose=False, plots=False,
               half=False)
    theirs = val(str(export_path), str(data), img_size=size, batch_size=4, workers=0, verbose=False, plots=False,
                 **runtime)
    assert ours.map50 > 0
    assert (theirs.map50, theirs.map) == (pytest.approx(ours.map50, abs=1e-3), pytest.approx(ours.map, abs=1e-3))
    images = sorted((data.parent / "images" / "val").iterdir())[:2]
    expected = predict(model, images, img_size=size, conf=0.3, half=False)
    actual = predict(export_path, images, img_size=size, conf=0.3, **runtime)
    assert sum(len(r.boxes) for r in expected) > 0
    for a, b in zip(expected, actual):
        assert b.names == a.names and len(b.boxes) == len(a.boxes) and torch.equal(a.classes, b.classes)
        torch.testing.assert_close(b.boxes, a.boxes, atol=0.05, rtol=1e-4)


def torch_output(model: torch.nn.Module, imgs: torch.Tensor) -> torch.Tensor:
    """What the exports are compared with: PyTorch's fused copy of ``model`` (as exports are traced) on ``imgs``."""
    import copy

    with torch.inference_mode():
        return copy.deepcopy(model).fuse()(imgs)


def assert_anchor_free_export_as_pytorch(fmt: str, out: Path, size: int, capfd: pytest.CaptureFixture) -> None:
    """An untrained yolov8n exported to ``fmt`` at ``out`` runs as an anchor-free detector giving PyTorch's decoded
    predictions (scores to 1e-4, pixels to 1e-3), and neither the conversion nor the runtime prints anything."""
    from yolotrain.interop import export, load_exported

    model = untrained("yolov8n")
    capfd.readouterr()
    path = export(model, fmt, out=out, img_size=size)
    runtime = load_exported(path, trust_code=True)
    assert (runtime.family, runtime.anchors_per_level, runtime.names) == ("anchor_free", 1, model.names)
    imgs = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(3))
    actual, expected = runtime(imgs), torch_output(model, imgs)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual[..., 4:], expected[..., 4:], atol=1e-4, rtol=0)
    torch.testing.assert_close(actual[..., :4], expected[..., :4], atol=1e-3, rtol=1e-5)
    assert capfd.readouterr() == ("", "")


def detecting_yolov5n(names: list[str]) -> Yolov5:
    """A random-init yolov5n (seed 0) for ``names``, in eval mode, whose objectness is biased up so that it detects
    something to compare."""
    torch.manual_seed(0)
    model = Yolov5("n", num_classes=len(names), names=names).eval()
    with torch.no_grad():
        for conv in model.head.m:
            conv.bias.view(model.head.na, -1)[:, 4].add_(6.0)
    return model


@contextlib.contextmanager
def network_refused() -> Iterator[None]:
    """Any network connection this process opens fails the test (a converter's child refuses them itself)."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the export opened a network connection")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket, "create_connection", refuse)
        yield


def assert_decodes_as_pytorch(runtime: object, model: torch.nn.Module, size: int) -> None:
    """An exported YOLOv5n detector's decoded predictions on two random images equal PyTorch's (scores to 1e-4,
    pixels to 1e-3), a check that would catch a 1% objectness error."""
    imgs = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    actual, expected = runtime(imgs), torch_output(model, imgs)
    assert actual.shape == expected.shape == (2, 3 * sum((size // s) ** 2 for s in (8, 16, 32)), 5 + model.num_classes)
    torch.testing.assert_close(actual[..., 4:], expected[..., 4:], atol=1e-4, rtol=0)  # objectness, scores
    torch.testing.assert_close(actual[..., :4], expected[..., :4], atol=1e-3, rtol=0)  # pixels
    with pytest.raises(AssertionError):  # negative control: a 1% objectness error is caught
        torch.testing.assert_close(actual[..., 4:] * 1.01, expected[..., 4:], atol=1e-4, rtol=0)


def assert_segments_or_classifies_as_pytorch(runtime: object, model: torch.nn.Module, size: int) -> None:
    """An exported segmentation model's decoded predictions and mask prototypes, or a classifier's logits, on two
    random ``size`` images equal PyTorch's (scores and logits to 1e-4, pixels to 1e-3, prototypes to 1e-4 of their
    largest value); the runtime says the model's task and names."""
    assert (runtime.task, runtime.names) == (model.task, model.names)
    imgs = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(4))
    actual, expected = runtime(imgs), torch_output(model, imgs)
    if model.task == "classify":
        torch.testing.assert_close(actual, expected, atol=1e-4, rtol=0)
        return
    (decoded, proto), (expected_decoded, expected_proto) = actual, expected
    assert proto.shape == expected_proto.shape == (2, 32, size // 4, size // 4)
    torch.testing.assert_close(decoded[..., 4:], expected_decoded[..., 4:], atol=1e-4, rtol=0)
    torch.testing.assert_close(decoded[..., :4], expected_decoded[..., :4], atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(proto, expected_proto, atol=1e-4 * float(expected_proto.abs().max()), rtol=1e-4)
