"""Datasets, verification, augmentations and loaders for YOLO-format detection data."""

from .batch import Batch
from .dataset import DetectionDataset
from .loaders import get_loaders
from .shapes import generate_shapes_dataset

__all__ = ["Batch", "DetectionDataset", "generate_shapes_dataset", "get_loaders"]

