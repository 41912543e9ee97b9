"""Classifiers: the YOLOv5-cls models against the reference's ClassificationModel, detectors cut into
classifiers, torchvision models by name, official ``yolov5*-cls.pt`` files read by the restricted unpickler."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

import yolotrain
from yolotrain import Yolov5
from yolotrain.checkpoint import save_checkpoint
from yolotrain.detector import BoxDetector, Detector
from yolotrain.interop import UnsupportedCheckpointError, load_model
from yolotrain.model.blocks import Conv
from yolotrain.model.classify import Classifier, classifier_from


def reference_detector(reference, version: str) -> nn.Module:
    config = Path(reference.__file__).parent / "models" / f"yolov5{version}.yaml"
    return reference.models.yolo.DetectionModel(str(config))


def reference_classifier(reference, version: str, nc: int, seed: int = 0) -> nn.Module:
    """The reference's ``ClassificationModel`` cut from its detector, with non-trivial BatchNorm statistics."""
    torch.manual_seed(seed)
    model = reference.models.yolo.ClassificationModel(model=reference_detector(reference, version), nc=nc)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean = torch.randn_like(module.running_mean) * 0.1
            module.running_var = torch.rand_like(module.running_var) + 0.5
    return model.eval()


# Slow: the reference builds each detector with a profiling pass. The strict state-dict load of the next
# test proves the same names and shapes for yolov5n-cls in the fast suite.
@pytest.mark.slow
@pytest.mark.parametrize("version", ["n", "s", "m", "l", "x"])
def test_parameter_counts_and_names_equal_the_reference(reference, version):
    from yolov5.utils.torch_utils import reshape_classifier_output

    theirs = reference.models.yolo.ClassificationModel(model=reference_detector(reference, version), nc=1000)
    ours = Classifier.from_name(f"yolov5{version}-cls", 1000)
    for nc in (1000, 10):
        reshape_classifier_output(theirs, nc)
        ours = ours.resize_head(nc)
        assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
        assert list(ours.state_dict()) == list(theirs.state_dict())
        shapes = {k: v.shape for k, v in theirs.state_dict().items()}
        assert {k: v.shape for k, v in ours.state_dict().items()} == shapes


def test_reference_weights_give_the_reference_logits(reference):
    theirs = reference_classifier(reference, "n", 10)
    ours = Classifier.from_name("yolov5n-cls", 10)
    ours.load_state_dict(theirs.state_dict())
    imgs = torch.randn(2, 3, 224, 160, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = theirs(imgs)
        torch.testing.assert_close(ours.eval()(imgs), expected, rtol=0, atol=0)
        # Folding the BatchNorms changes only rounding.
        torch.testing.assert_close(copy.deepcopy(ours).fuse()(imgs), expected, rtol=1e-4, atol=1e-4)


def test_a_detector_is_cut_into_a_classifier_as_the_reference_cuts_it(reference):
    torch.manual_seed(0)
    config = Path(reference.__file__).parent / "models" / "yolov5n.yaml"
    their_detector = reference.models.yolo.DetectionModel(str(config), nc=80)
    detector = Yolov5("n", num_classes=80)
    detector.load_state_dict(their_detector.state_dict())
    theirs = reference.models.yolo.ClassificationModel(model=copy.deepcopy(their_detector), nc=4, cutoff=8).eval()
    ours = classifier_from(detector, 4, ["a", "b", "c", "d"], cutoff=8)
    assert (ours.arch, ours.cutoff, ours.names, ours.task) == ("yolov5n-cls", 8, ["a", "b", "c", "d"], "classify")
    # The backbone's weights are the detector's; only the head is new.
    assert ours.model[0].conv.weight is detector.model[0].conv.weight
    ours.model[-1].load_state_dict(theirs.model[-1].state_dict())
    imgs = torch.rand(1, 3, 96, 128)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(imgs), theirs(imgs), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"^cannot cut at layer 14: the layers before it are not one chain"):
        classifier_from(detector, 4, cutoff=14)


@pytest.mark.parametrize("name", ["resnet18", "efficientnet_b0"])
def test_torchvision_models_by_name_have_their_head_resized_as_the_reference_does(reference, name):
    import torchvision
    from yolov5.utils.torch_utils import reshape_classifier_output

    theirs = torchvision.models.get_model(name, weights=None)
    reshape_classifier_output(theirs, 7)
    ours = yolotrain.resolve_model(name, names=[f"c{i}" for i in range(7)])
    assert isinstance(ours, Classifier) and isinstance(ours, Detector)
    assert (ours.num_classes, ours.names[-1], ours.default_img_size, ours.arch) == (7, "c6", 224, name)
    assert {k: v.shape for k, v in ours.model.state_dict().items()} == \
           {k: v.shape for k, v in theirs.state_dict().items()}
    with torch.no_grad():
        assert ours.eval()(torch.rand(2, 3, 64, 64)).shape == (2, 7)


def test_published_classifier_names_resolve_to_classifiers():
    model = yolotrain.load("yolov5n-cls", names=["cat", "dog"])
    assert isinstance(model, Classifier) and model.names == ["cat", "dog"] and model.task == "classify"
    assert isinstance(model, Detector) and not hasattr(model, "num_masks")  # no mask field to fake
    # No output levels or NMS to fake either: only the size its inputs round to.
    assert not any(hasattr(model, name) for name in ("stride", "max_stride", "end_to_end"))
    assert not isinstance(model, BoxDetector) and model.size_multiple == 32
    assert yolotrain.resolve_model("yolov5n-cls").num_classes == 1000
    with pytest.raises(ValueError, match="unknown classification model 'yolov5q-cls'"):
        Classifier.from_name("yolov5q-cls")


def test_an_official_cls_checkpoint_loads_through_the_restricted_unpickler(reference, tmp_path):
    """The layout of the reference's classify/train.py: the EMA model in fp16 under 'model', no 'ema'."""
    theirs = reference_classifier(reference, "n", 3, seed=1)
    theirs.names = {0: "cat", 1: "dog", 2: "emu"}
    from yolov5.utils.augmentations import classify_transforms

    theirs.transforms = classify_transforms(224)  # as classify/train.py attaches them: inert placeholders here
    path = tmp_path / "yolov5n-cls.pt"
    torch.save({"epoch": 5, "best_fitness": 0.5, "model": copy.deepcopy(theirs).half(), "ema": None, "updates": 10,
                "optimizer": None, "opt": {"imgsz": 224, "save_dir": Path("runs/train-cls/exp")}, "date": "2024-01-01"},
               path)
    ours = load_model(path)
    assert isinstance(ours, Classifier)
    assert (ours.arch, ours.cutoff, ours.names, ours.dtype) == ("yolov5n-cls", 10, ["cat", "dog", "emu"], torch.float32)
    served = copy.deepcopy(theirs).half().float()  # what the reference serves: the fp16 weights as float32
    imgs = torch.rand(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(ours(imgs), served(imgs), rtol=0, atol=0)
    # A bare state dict of a classifier loads too; one of a size no published model has is named.
    torch.save(theirs.state_dict(), tmp_path / "state.pt")
    assert load_model(tmp_path / "state.pt").num_classes == 3
    odd = {k: v for k, v in theirs.state_dict().items()}
    odd["model.0.conv.weight"] = torch.zeros(24, 3, 6, 6)
    torch.save(odd, tmp_path / "odd.pt")
    with pytest.raises(UnsupportedCheckpointError,
                       match="classifier state dict with stem width 24, which matches none of yolov5n-cls"):
        load_model(tmp_path / "odd.pt")


@pytest.mark.parametrize("version", ["n", "n6"])
def test_a_published_classifier_built_from_its_kept_layers_equals_the_cut_detector(version):
    """``from_name`` builds layers 0 … cutoff-2 and the head only, with the random draws a whole detector's build
    makes for them, and the same errors; ``empty=True`` builds them without weights, which ``assign`` brings."""
    name = f"yolov5{version}-cls"
    for cutoff in (1, 2, 10, 13, 14, 15, 99):  # n: Concat at 12; n6: Conv at 12, Upsample at 13, Concat at 14
        torch.manual_seed(cutoff)
        try:
            cut = Classifier.from_detector(Yolov5(version, num_classes=1), 7, cutoff=cutoff)
        except ValueError as exc:
            for empty in (False, True):
                with pytest.raises(ValueError, match=f"^{re.escape(str(exc))}$"):
                    Classifier.from_name(name, 7, cutoff=cutoff, empty=empty)
            continue
        torch.manual_seed(cutoff)
        direct = Classifier.from_name(name, 7, cutoff=cutoff)
        assert (direct.arch, direct.cutoff, repr(direct)) == (cut.arch, cut.cutoff, repr(cut))
        expected, built = cut.state_dict(), direct.state_dict()
        assert [(k, v.shape, v.dtype) for k, v in built.items()] == [(k, v.shape, v.dtype) for k, v in expected.items()]
        backbone = [k for k in expected if not k.startswith(f"model.{cutoff - 1}.")]
        assert all(torch.equal(built[k], expected[k]) for k in backbone)

        empty = Classifier.from_name(name, 7, cutoff=cutoff, empty=True)
        assert all(t.is_meta for t in empty.state_dict().values()) and repr(empty) == repr(cut)
        empty.assign({k: v.clone() for k, v in expected.items()}).eval()
        assert not any(t.is_meta for t in [*empty.parameters(), *empty.buffers()])
        imgs = torch.rand(2, 3, 64, 64)
        with torch.no_grad():
            torch.testing.assert_close(empty(imgs), cut.eval()(imgs), rtol=0, atol=0)


def test_reading_a_classifier_checkpoint_draws_no_random_weights(tmp_path):
    model = Classifier.from_name("yolov5n-cls", 2, ["cat", "dog"])
    path = save_checkpoint(tmp_path / "c", model)
    torch.save(model.state_dict(), tmp_path / "state.pt")
    for weights in (path, tmp_path / "state.pt"):
        rng = torch.get_rng_state()
        loaded = load_model(weights)
        assert torch.equal(torch.get_rng_state(), rng)
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())


@pytest.mark.parametrize("build", [lambda: Classifier.from_name("yolov5n-cls", 7), lambda: Yolov5("n", num_classes=3)],
                         ids=["classifier", "detector"])
def test_fusing_folds_each_batchnorm_as_torch_does_into_the_same_convolutions(build):
    """fuse() gives every convolution the weights torch's ``fuse_conv_bn_eval`` folds, taken by the
    convolution itself (no copy of each layer first); the outputs are those of the folded copies."""
    torch.manual_seed(0)
    model = build()
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):  # statistics as training leaves them
        for tensor, low in ((bn.running_mean, -1), (bn.running_var, 0.1), (bn.weight, 0.5), (bn.bias, -1)):
            tensor.data.uniform_(low, low + 2)
    expected = copy.deepcopy(model).eval()
    for block in (m for m in expected.modules() if isinstance(m, Conv)):
        block.conv, block.bn = fuse_conv_bn_eval(block.conv, block.bn), nn.Identity()
    convs = [m.conv for m in model.modules() if isinstance(m, Conv)]
    model.fuse()
    assert not model.training
    assert [m.conv for m in model.modules() if isinstance(m, Conv)] == convs  # the same modules, not copies
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    fused, reference = model.state_dict(), expected.state_dict()
    assert list(fused) == list(reference) and all(torch.equal(fused[k], reference[k]) for k in reference)
    assert [p.requires_grad for p in model.parameters()] == [p.requires_grad for p in expected.parameters()]
    imgs = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(imgs), expected(imgs), rtol=0, atol=0)
