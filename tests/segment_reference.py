"""The reference's ``SegmentationModel`` (yolov5n-seg) as a test oracle: built with ``yolov5n.pt``'s
detection weights (so its boxes are real), and wrapped as a segmentation :class:`~yolotrain.detector.Detector`
so our ``val`` runs the very same network."""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def reference_segmenter(reference, weights_path: Path, nc: int = 80, seed: int = 0) -> torch.nn.Module:
    """The reference yolov5n-seg in eval mode: every tensor ``yolov5n.pt`` has copied over, each head
    convolution's box, objectness and class rows per anchor too; the prototypes and mask coefficients
    keep the seeded initialisation."""
    models = Path(reference.__file__).parent / "models"
    torch.manual_seed(seed)
    model = reference.models.yolo.SegmentationModel(str(models / "segment" / "yolov5n-seg.yaml"), nc=nc)
    sys.path.insert(0, str(Path(reference.__file__).parent))  # the pickle names 'models.yolo'
    try:
        ckpt = torch.load(weights_path, map_location="cpu", weights_only=False)
    finally:
        sys.path.remove(str(Path(reference.__file__).parent))
    state = model.state_dict()
    per_anchor = 5 + nc
    for key, value in ckpt["model"].float().state_dict().items():
        if key in state and state[key].shape == value.shape:
            state[key] = value
        elif key in state and key.startswith("model.24.m."):
            rows = state[key].view(3, -1, *state[key].shape[1:]).clone()
            rows[:, :per_anchor] = value.view(3, per_anchor, *value.shape[1:])
            state[key] = rows.view(state[key].shape)
    model.load_state_dict(state)
    names = ckpt["model"].names
    model.names = list(names.values()) if isinstance(names, dict) else list(names)
    return model.eval()


class ReferenceSegmenter:
    """A reference ``SegmentationModel`` behind the BoxDetector protocol: ``model(imgs)`` is (decoded, proto)."""

    task = "segment"
    end_to_end = False
    dynamic_size = True
    fixed_size = None
    default_img_size = 640
    device = torch.device("cpu")
    dtype = torch.float32
    precision = "fp32"

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.names = list(model.names)
        self.num_classes = model.model[-1].nc
        self.num_masks = model.model[-1].nm
        self.stride = model.stride
        self.max_stride = self.size_multiple = int(model.stride.max())

    def __call__(self, imgs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        decoded, proto = self.model(imgs)[:2]
        return decoded, proto


def our_segmenter(reference_model: torch.nn.Module):
    """Our ``Yolov5(task="segment")`` holding the reference model's weights."""
    from yolotrain import Yolov5

    model = Yolov5("n", reference_model.model[-1].nc, task="segment", names=list(reference_model.names))
    model.load_state_dict(reference_model.state_dict())
    return model.eval()
