"""Datasets, verification, augmentations and loaders for YOLO-format detection data."""

from .dataset import DetectionDataset
from .loaders import get_loaders

__all__ = ["DetectionDataset", "generate_shapes_dataset", "get_loaders"]


def __getattr__(name: str):
    # Imported on first use so ``python -m yolotrain.data.shapes`` does not load the module twice.
    if name == "generate_shapes_dataset":
        from .shapes import generate_shapes_dataset

        return generate_shapes_dataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
