"""yolotrain: train, evaluate, export and debug YOLO models (detection, segmentation, classification) in PyTorch.

The public names load on first use (PEP 562): ``import yolotrain`` imports none of the API's modules, so
that ``yolotrain doctor`` and ``import yolotrain.doctor`` start without OpenCV, torchvision and the
training engine.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and the import contracts read; at run time __getattr__ imports them
    from .data import get_loaders
    from .detector import Detector
    from .engine import TrainConfig, resolve_config, train
    from .eval.val import val
    from .interop import export, resolve_model
    from .interop import resolve_trainable as load
    from .loss import YOLO_LOSS, DivergenceError, YoloLoss
    from .model import Yolov5
    from .prediction.run import predict
    from .settings import ConfigError
    from .track.run import track  # the function: the package's names import as `from yolotrain.track import ...`
    from .tuning import tune
    from .yolo import YOLO

__all__ = ["YOLO", "YOLO_LOSS", "ConfigError", "Detector", "DivergenceError", "TrainConfig", "YoloLoss", "Yolov5",
           "export", "get_loaders", "load", "predict", "resolve_config", "resolve_model", "track", "train", "tune",
           "val"]
__version__ = "0.1.0"

# Each public name: (the module that defines it, its name there).
_SOURCES: dict[str, tuple[str, str]] = {
    "YOLO": (".yolo", "YOLO"),
    "YOLO_LOSS": (".loss", "YOLO_LOSS"),
    "ConfigError": (".settings", "ConfigError"),
    "Detector": (".detector", "Detector"),
    "DivergenceError": (".loss", "DivergenceError"),
    "TrainConfig": (".engine", "TrainConfig"),
    "YoloLoss": (".loss", "YoloLoss"),
    "Yolov5": (".model", "Yolov5"),
    "export": (".interop", "export"),
    "get_loaders": (".data", "get_loaders"),
    "load": (".interop", "resolve_trainable"),
    "predict": (".prediction.run", "predict"),
    "resolve_config": (".engine", "resolve_config"),
    "resolve_model": (".interop", "resolve_model"),
    "track": (".track.run", "track"),
    "train": (".engine", "train"),
    "tune": (".tuning", "tune"),
    "val": (".eval.val", "val"),
}


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first access and kept in the package's namespace."""
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _SOURCES[name]
    value = getattr(importlib.import_module(module, __name__), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(ModuleType):
    """``yolotrain.track`` names the function ``track``, though ``yolotrain/track/`` is also a subpackage.

    Importing a subpackage binds it as an attribute of its parent; for ``yolotrain.track`` the package keeps
    the name for the function instead (loaded by ``__getattr__``), whichever of the two is imported first.
    The subpackage stays reachable as ``sys.modules["yolotrain.track"]`` and through ``from yolotrain.track
    import ...``.
    """

    def __setattr__(self, name: str, value: object) -> None:
        if name == "track" and isinstance(value, ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
