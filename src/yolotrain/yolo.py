"""``YOLO``: one object for one model, with the commands as its methods::

    from yolotrain import YOLO

    model = YOLO("yolov5n")                      # or yolov5s-seg.yaml, yolov5n-cls, best.json, yolov5n.pt, model.onnx
    model.train(data="data.yaml", epochs=50)      # the model now holds the run's best weights
    model.val()                                   # on the data it was trained on
    results = model("bus.jpg")                    # predict: results[0].boxes, .plot(), .to_df()
    model.export(format="onnx")

Each method takes the settings of its command as keywords, under their names in the typed configurations
(:class:`~yolotrain.engine.TrainConfig`, :class:`~yolotrain.eval.val.ValConfig`,
:class:`~yolotrain.prediction.run.PredictConfig`, :class:`~yolotrain.interop.exporting.exporter.ExportConfig`,
:class:`~yolotrain.track.run.TrackConfig`, :class:`~yolotrain.tuning.study.TuneOptions`): the accepted
names are read from them and the values validated by them, so a misspelt name is one
:class:`~yolotrain.settings.ConfigError` with the closest valid one. The model itself is the object's:
``model``/``weights`` are not settings here. The free functions (:func:`yolotrain.train`, ``val``,
``predict`` ...) are what the methods call.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .callbacks import Callbacks, CallbackSpec
from .checkpoint import CheckpointError, checkpoint_paths, read_metadata
from .data import generate_shapes_dataset
from .detector import Detector
from .devices import select_device
from .engine import TrainConfig, TrainResult
from .engine import train as train_run
from .engine.resume import ResumeOptions
from .eval.classify import ClassifyMetrics
from .eval.metrics import Metrics
from .eval.val import ValConfig
from .eval.val import val as val_run
from .interop.exporting.exporter import ExportConfig, default_output
from .interop.exporting.exporter import export as export_run
from .interop.loading.resolve import MODEL_YAML_SUFFIXES, resolve_model
from .model.summary import ModelSummary, summarise
from .prediction.classify import ClassifyResult
from .prediction.run import PredictConfig, Result, Source
from .prediction.run import predict as predict_run
from .runs import next_run_dir
from .settings import ConfigError, field_types, flat_names, flat_values, from_flat, is_section, unknown_name_error
from .task import get_task, task_names, task_of
from .track.evaluate import evaluate_tracks
from .track.outputs import MOT_FOLDER
from .track.result import TrackResult
from .track.run import DEFAULT_PROJECT as TRACK_PROJECT
from .track.run import TrackConfig, format_scores
from .track.run import track as track_run
from .tuning import TuneResult
from .tuning import tune as tune_run
from .tuning.study import TuneOptions

# Settings that name the model: the object is the model.
_MODEL_SETTINGS = ("model", "weights")
# What the train and tune commands take besides their settings (the --config and --hyp files, --resume).
_TRAIN_INPUTS = ("config", "hyp", "resume")


def _setting_names(*configs: type) -> set[str]:
    """Every keyword the configurations take: flat setting names, their aliases and whole sections."""
    names: set[str] = set()
    for config in configs:
        names |= set(flat_names(config))
        types = field_types(config)
        names |= {f.name for f in dataclasses.fields(config) if is_section(types[f.name])}
    return names


def _check_names(method: str, given: Iterable[str], accepted: set[str]) -> None:
    """A one-line :class:`ConfigError` for a keyword that is no setting of ``method`` (with the closest
    one), or that names the model, which is the object's own."""
    for name in given:
        if name in _MODEL_SETTINGS:
            raise ConfigError(f"YOLO.{method}: {name!r}: the model is this object's own; make another YOLO(...) "
                              "for another model")
        if name not in accepted:
            raise unknown_name_error(name, sorted(accepted - set(_MODEL_SETTINGS)), f"YOLO.{method}: ")


def _keywords(config: Any, function: Callable[..., Any], *taken: str) -> dict[str, Any]:
    """The settings of ``config`` that ``function`` takes as keywords, less those passed as ``taken``."""
    parameters = set(inspect.signature(function).parameters) - set(taken)
    return {name: value for name, value in flat_values(config).items() if name in parameters}


def _published_name(source: str) -> str:
    """``yolov5s-seg.yaml`` that is not a file is the published architecture ``yolov5s-seg`` (the reference
    finds its model YAMLs in its own folder); any other source stays as it is."""
    path = Path(source)
    if path.suffix.lower() not in MODEL_YAML_SUFFIXES or path.exists():
        return source
    if any(get_task(task).names_model_yaml(path.stem) for task in task_names()):
        return path.stem
    return source  # not a published name: the missing file is reported when the model is built


class YOLO:
    """A model and the commands over it: :meth:`train`, :meth:`val`, :meth:`predict` (also ``model(source)``),
    :meth:`export`, :meth:`track`, :meth:`tune` and :meth:`info`.

    ``model`` is any model :func:`yolotrain.resolve_model` reads: a published name (``yolov5n``,
    ``yolov5s-seg``, ``yolov5n-cls``, a torchvision classifier) or model YAML (random weights; ``yolov5s.yaml``
    that is not a file is the published ``yolov5s``), our checkpoint set (``runs/train/exp/weights/best.json``),
    an official ``.pt`` (``yolov5n.pt`` is downloaded once), an export (``.onnx``, OpenVINO ``.xml`` ...: val,
    predict and track only), or a model object. ``trust_code`` lets exports that are programs (TorchScript,
    TensorRT engines) load.

    Attributes:
        model: the loaded :class:`~yolotrain.detector.Detector` (a :class:`~yolotrain.Yolov5`, a classifier or
            an export's runtime); after :meth:`train`, the run's best weights.
        source: the name or path the model was read from (train's ``model`` setting), None for a model object.
    """

    def __init__(self, model: str | os.PathLike | Detector = "yolov5n", *, trust_code: bool = False) -> None:
        self.source = _published_name(os.fspath(model)) if isinstance(model, (str, os.PathLike)) else None
        self.model: Detector = resolve_model(self.source if self.source is not None else model, trust_code=trust_code)

    @property
    def task(self) -> str:
        """``detect``, ``segment`` or ``classify``."""
        return self.model.task

    @property
    def names(self) -> list[str]:
        """The class names, by class id."""
        return list(self.model.names)

    def __repr__(self) -> str:
        return f"YOLO({self.source or type(self.model).__name__!r}: {self.task}, {len(self.names)} classes)"

    def _from_file(self) -> bool:
        """Whether the model was read from a weights or export file (not built from a name or YAML)."""
        if self.source is None or Path(self.source).suffix.lower() in MODEL_YAML_SUFFIXES:
            return False
        return Path(self.source).is_file() or checkpoint_paths(self.source)[1].is_file()

    def _trainable_source(self, method: str) -> str:
        if self.source is None:
            raise ConfigError(f"YOLO.{method}: a model object has no name to train from: save it "
                              "(yolotrain.checkpoint.save_checkpoint) and make YOLO(path)")
        return self.source

    def _device(self, device: str | None) -> str | torch.device | None:
        """Where val and predict run a PyTorch model: ``device``, else the best device, as for a weights file
        (a model given to them would otherwise stay where it is)."""
        if device is None and task_of(self.model).is_pytorch_model(self.model):
            return select_device(None)
        return device

    def train(self, *, callbacks: Callbacks | CallbackSpec | None = None, **settings: Any) -> TrainResult:
        """Train this model: ``model.train(data="data.yaml", epochs=50, img_size=640, lr0=0.01)``.

        The settings are ``yolotrain train``'s (:class:`~yolotrain.engine.TrainConfig`'s flat names or whole
        sections, :class:`~yolotrain.engine.resume.ResumeOptions`), with ``config`` and ``hyp`` (files or
        mappings) and ``resume`` (True, a run folder or a ``last`` checkpoint: that run's own settings).
        Afterwards the object holds the run's best weights, and :meth:`val` defaults to its data.

        Returns:
            The run's :class:`~yolotrain.engine.TrainResult` (its folder, ``last``/``best`` checkpoints, metrics).
        """
        _check_names("train", settings, _setting_names(TrainConfig, ResumeOptions) | set(_TRAIN_INPUTS))
        if not settings.get("resume"):  # a resumed run continues with the model it saved
            settings["model"] = self._trainable_source("train")
        result = train_run(callbacks=callbacks, **settings)
        self.source = str(checkpoint_paths(result.best)[1])  # best.json: the name train and export take too
        self.model = resolve_model(self.source)
        return result

    def val(self, *, callbacks: Callbacks | CallbackSpec | None = None, **settings: Any) -> Metrics | ClassifyMetrics:
        """Evaluate this model: ``model.val(data="data.yaml", img_size=640, conf=0.001)``; ``yolotrain val``'s
        settings (:class:`~yolotrain.eval.val.ValConfig`). ``data`` defaults to the dataset a checkpoint of
        ours was trained on (the built-in shapes data included). Results go to ``runs/val/exp`` (``project``,
        ``name``), as the command's; ``mode="speed"`` writes nothing.

        Returns:
            Detection :class:`~yolotrain.eval.metrics.Metrics` (with ``masks`` for segmentation), or a
            classifier's :class:`~yolotrain.eval.classify.ClassifyMetrics`.
        """
        _check_names("val", settings, _setting_names(ValConfig))
        if settings.get("data") is None:
            settings["data"] = self._trained_data()
        config = from_flat(ValConfig, settings)
        save_dir = None if config.mode == "speed" else next_run_dir(config.project, config.name, config.exist_ok)
        keywords = _keywords(config, val_run, "model_or_weights", "data")
        keywords["device"] = self._device(config.device)
        return val_run(self.model, config.data, save_dir=save_dir, callbacks=callbacks, **keywords)

    def _trained_data(self) -> str:
        """The dataset a checkpoint of ours records (the built-in shapes data when it was generated)."""
        record = None
        if self._from_file():
            try:
                record = read_metadata(self.source)[0].get("dataset")
            except CheckpointError:  # not a checkpoint of ours (an official .pt, an export)
                record = None
        if not isinstance(record, Mapping):
            raise ConfigError("YOLO.val: data: give the dataset folder or YAML to evaluate on (only checkpoints of "
                              "ours record the data they were trained on)")
        return record["path"] if record.get("path") is not None else str(generate_shapes_dataset())

    def predict(self, source: Source | Sequence[Source], *, stream: bool = False,
                callbacks: Callbacks | CallbackSpec | None = None,
                **settings: Any) -> list[Result | ClassifyResult] | Iterator[Result | ClassifyResult]:
        """Predict on images, videos, folders, globs, BGR arrays, cameras or streams:
        ``model.predict("images/", conf=0.5, img_size=640)``; ``yolotrain predict``'s settings
        (:class:`~yolotrain.prediction.run.PredictConfig`). As Python users expect, nothing is written unless
        asked: ``save=True`` (annotated images and videos), ``save_txt``, ``save_crop``, ``visualize`` make a run folder
        (``runs/predict/exp``; ``project``, ``name``) with ``predictions.json``.

        Returns:
            One result per image and frame (:class:`~yolotrain.prediction.run.Result`, or
            :class:`~yolotrain.prediction.classify.ClassifyResult` for a classifier); those of still images keep the
            image, so ``plot()`` needs no file; video frames are read again. With ``stream``, an iterator
            whose results all keep their image.
        """
        _check_names("predict", settings, _setting_names(PredictConfig) - {"source"})
        settings.setdefault("save", False)
        config = from_flat(PredictConfig, settings)
        keywords = _keywords(config, predict_run, "model_or_weights", "source")
        keywords["device"] = self._device(config.device)
        results = predict_run(self.model, source, save_dir=self._save_dir(config), stream=True, callbacks=callbacks,
                              **keywords)
        if stream:
            return results
        return [result if result.frame is None else dataclasses.replace(result, image=None) for result in results]

    __call__ = predict

    @staticmethod
    def _save_dir(config: PredictConfig, *, always: bool = False) -> Path | None:
        """The run folder when something is to be saved in it."""
        if always or config.save or config.save_txt or config.save_crop or config.visualize:
            return next_run_dir(config.project, config.name, config.exist_ok)
        return None

    def track(self, source: Source | Sequence[Source], *, stream: bool = False,
              callbacks: Callbacks | CallbackSpec | None = None,
              **settings: Any) -> list[TrackResult] | Iterator[TrackResult]:
        """Follow objects through videos, streams and folders of frames: ``model.track("clip.mp4",
        tracker="botsort")``; ``yolotrain track``'s settings (:class:`~yolotrain.prediction.run.PredictConfig`'s,
        with ``conf`` 0.1 unless given, and :class:`~yolotrain.track.run.TrackConfig`'s). As :meth:`predict`,
        files are written only when asked (``save``, ``save_txt``, ``save_crop``: ``runs/track/exp`` with the
        MOTChallenge rows and JSON of each sequence); ``eval`` (a ground-truth folder) scores the tracks into
        the run folder's ``metrics.json`` and prints the table.

        Returns:
            One :class:`~yolotrain.track.TrackResult` per image and frame (with ``stream``, an iterator).
        """
        track_names = _setting_names(TrackConfig)
        _check_names("track", settings, (_setting_names(PredictConfig) - {"source"}) | track_names)
        own = from_flat(TrackConfig, {k: v for k, v in settings.items() if k in track_names})
        predict_settings = {k: v for k, v in settings.items() if k not in track_names}
        predict_settings.setdefault("save", False)
        predict_settings.setdefault("project", TRACK_PROJECT)
        config = from_flat(PredictConfig, predict_settings)
        if own.eval is not None:
            if stream:
                raise ConfigError("YOLO.track: eval scores the finished run: not with stream=True")
            if not Path(own.eval).is_dir():
                raise FileNotFoundError(f"ground-truth folder not found: {own.eval}")
        save_dir = self._save_dir(config, always=own.eval is not None)
        keywords = _keywords(config, predict_run, "model_or_weights", "source")
        keywords["device"] = self._device(config.device)
        if "conf" not in settings:
            del keywords["conf"]  # track()'s own default
        results = track_run(self.model, source, own.tracker, save_dir=save_dir, trail=own.trail, stream=stream,
                            callbacks=callbacks, **keywords)
        if own.eval is not None and save_dir is not None:
            frames: dict[str, int] = {}
            for result in results:
                frames[result.sequence] = max(frames.get(result.sequence, 0), result.mot_frame)
            if frames:
                scores = evaluate_tracks(own.eval, save_dir / MOT_FOLDER, frames)
                (save_dir / "metrics.json").write_text(json.dumps(scores, indent=2))
                print(format_scores(scores))
        return results

    def export(self, **settings: Any) -> Path | list[Path]:
        """Export this model: ``model.export(format="onnx", img_size=320, dynamic_size=True)``; ``yolotrain
        export``'s settings (:class:`~yolotrain.interop.exporting.exporter.ExportConfig`). Without ``output``, a
        checkpoint's export goes beside it, a model built from a name or YAML's to ``NAME.onnx`` ... in the working
        folder.

        Returns:
            The written file; with several formats (``format="onnx,openvino"``), the list of them.
        """
        _check_names("export", settings, _setting_names(ExportConfig))
        config = from_flat(ExportConfig, settings)
        formats = [f for f in config.format if f]
        if not formats:
            raise ConfigError("YOLO.export: format is empty")
        if len(formats) > 1 and config.output is not None:
            raise ConfigError("YOLO.export: output names one file: leave it out when exporting several formats")
        options = _keywords(config, export_run, "weights_or_model", "fmt", "out")
        if self._from_file():  # the file itself: its export goes beside it, and it is never written over
            written = [export_run(self.source, fmt, out=config.output, **options) for fmt in formats]
        else:
            stem = Path(Path(self.source).stem if self.source is not None else self._name())
            written = [export_run(self.model, fmt, out=config.output or default_output(stem, fmt, config.half,
                                                                                        config.int8), **options)
                       for fmt in formats]
        return written[0] if len(written) == 1 else written

    def tune(self, **settings: Any) -> TuneResult:
        """Search hyper-parameters for this model: ``model.tune(data="data.yaml", epochs=10, trials=30)``;
        ``yolotrain tune``'s settings (:class:`~yolotrain.tuning.study.TuneOptions`' and every train setting,
        with ``config`` and ``hyp``); samplers and pruners by name, as on the command line (Optuna objects:
        :func:`yolotrain.tune`). The object's model is not changed: the study's best settings are in the
        result (``best_hyp``), to train with.
        """
        search_names = _setting_names(TuneOptions)
        _check_names("tune", settings, search_names | _setting_names(TrainConfig) | {"config", "hyp"})
        search = from_flat(TuneOptions, {k: v for k, v in settings.items() if k in search_names})
        train_settings = {k: v for k, v in settings.items() if k not in search_names}
        return tune_run(model=self._trainable_source("tune"), **flat_values(search), **train_settings)

    def _name(self) -> str:
        """The architecture's name: ``yolov5n``, ``yolov5s-seg``, ``yolov5n-cls``, ``resnet18``."""
        if task_of(self.model).is_pytorch_model(self.model):
            return self.model.arch_name
        return type(self.model).__name__

    def info(self) -> ModelSummary:
        """Print and return the model's layers, parameters, gradients and GFLOPs (at its default input size:
        640, 1280 for P6 models, 224 for classifiers), as the reference's ``model_info`` does.

        Raises:
            ValueError: an export: its layers are in its runtime's graph.
        """
        if not task_of(self.model).is_pytorch_model(self.model):
            raise ValueError(f"{self.source}: an exported model; info() describes PyTorch models (make YOLO() of "
                             "the checkpoint it was exported from)")
        summary = summarise(self.model, self._name(), self.model.default_img_size, self.model.in_channels)
        print(summary)
        return summary

