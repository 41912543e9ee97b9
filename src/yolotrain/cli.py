"""``yolotrain`` command line: argument parsing over the Python API, one-line errors."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any, NoReturn

import cv2

from .checkpoint import CheckpointError
from .data import generate_shapes_dataset
from .data.check import check_dataset
from .data.shapes import LABEL_KINDS
from .data.tiles import MIN_SHARE, TILE_GAP, TILE_SIZE, split_oriented_dataset
from .devices import check_gpu_list, gpu_list
from .doctor.cli import main as doctor_main
from .engine import train
from .engine.autobatch import DEFAULT_FRACTION
from .engine.config import TrainConfig, add_weights_option, model_settings
from .engine.distributed import DistributedError, launch_command, record_error_for_agent
from .engine.loggers import LoggerError
from .engine.trainer import ResumeOptions, TrainingError
from .eval.val import add_val_arguments, run_val
from .interop import UnsafeCheckpointError
from .interop.exporting.exporter import add_export_arguments, run_export
from .interop.loading.resolve import resolve_model
from .loss import DivergenceError
from .messages import closest_name, one_line_warnings, shorten
from .model.summary import layer_table, summarise
from .prediction.run import add_predict_arguments, run_predict
from .runs import RunInUseError
from .settings import add_arguments, add_refused, check_refused, unknown_name_error
from .task import task_of
from .track.run import add_track_arguments, run_track
from .tuning import TuneError
from .tuning.evolve import evolve
from .tuning.study import add_tune_arguments

# Exceptions that mean "bad input or configuration": printed as one line, no traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (FileNotFoundError, NotADirectoryError, PermissionError,
                                                 ValueError, KeyError)
# The project's own errors: also one line.
DOMAIN_ERRORS: tuple[type[BaseException], ...] = (CheckpointError, TrainingError, UnsafeCheckpointError,
                                                   DivergenceError, LoggerError, RunInUseError, DistributedError,
                                                   TuneError)


# Options of the reference's train.py for features yolotrain does not have, and why: each stops the run
# with one line rather than being ignored. docs/coming-from-yolov5.md lists them with the other differences.
UNSUPPORTED_TRAIN_OPTIONS = {
    "--bucket": "evolve.csv stays in the run folder; to share a search between machines, run yolotrain tune "
                "with one --storage",
    "--nosave": "every epoch's last checkpoint is written because --resume continues from it",
    "--artifact_alias": "W&B dataset artifacts are not used; the data is read from --data",
    "--upload_dataset": "datasets are not uploaded anywhere",
    "--s3_upload_dir": "weights and datasets are not uploaded to S3",
    "--neptune_token": "--logger neptune reads the token from $NEPTUNE_API_TOKEN (without it the run is offline)",
    "--neptune_project": "--logger neptune reads the project from $NEPTUNE_PROJECT",
    "--neptune_resume_id": "--logger neptune: --resume continues the run's own Neptune run",
    "--hf_model_id": "weights are not uploaded to the Hugging Face Hub",
    "--hf_token": "weights are not uploaded to the Hugging Face Hub",
    "--hf_private": "weights are not uploaded to the Hugging Face Hub",
    "--hf_dataset_id": "weights are not uploaded to the Hugging Face Hub",
    "--roboflow_token": "weights are not uploaded to Roboflow",
    "--roboflow_upload": "weights are not uploaded to Roboflow",
}


def _train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model (default: yolov5n on the built-in shapes dataset)",
                       description="Train a detector, segmenter or classifier (the model and the data say which). "
                       "Settings not given follow the data: the built-in shapes "
                       "dataset gets a quick CPU recipe, real datasets the reference YOLOv5 one.")
    p.add_argument("--config", help="a run's config.yaml (nested settings) to start from")
    p.add_argument("--hyp", help="hyper-parameter YAML (flat: lr0, mosaic, box ...) over the defaults")
    p.add_argument("--resume", nargs="?", const=True, default=False,
                   help="continue the latest run, or the given run folder or last checkpoint, with its own "
                   "settings (only --device and --workers may change)")
    p.add_argument("--evolve", type=int, nargs="?", const=300, metavar="N",
                   help="evolve the hyper-parameters over N training runs (300 alone) as the reference does, in "
                   "runs/evolve/exp: evolve.csv, hyp_evolve.yaml; the same command continues an interrupted one")
    p.add_argument("--cfg", help="architecture to train: a model YAML, or yolov5s.yaml … for the published ones (the "
                   "reference's spelling of --model); from scratch, or from --weights")
    add_weights_option(p)
    # torch.distributed.launch passes it; the rank is read from LOCAL_RANK, as the reference reads it.
    p.add_argument("--local_rank", "--local-rank", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    add_refused(p, UNSUPPORTED_TRAIN_OPTIONS)
    add_arguments(p, TrainConfig)
    for action in p._actions:
        if action.dest == "batch_size":  # the reference's AutoBatch spellings: -1, or a fraction of GPU memory
            action.type = _batch_value
    add_arguments(p, ResumeOptions)
    p.set_defaults(run=_run_train)


def _batch_value(text: str) -> int | float:
    """``--batch``: a number of images, ``-1`` or a fraction (AutoBatch; see :func:`train_settings`)."""
    value = float(text)
    return int(value) if value.is_integer() else value


_batch_value.__name__ = "batch"  # argparse names the type in its error: "invalid batch value"


def _run_train(args: argparse.Namespace) -> int:
    gpus = gpu_list(getattr(args, "device", None))
    if args.evolve is not None:
        if len(gpus) > 1:
            raise ValueError("--evolve trains one generation at a time on one device; give one --device")
        evolve(args.evolve, args.config, hyp=args.hyp, resume=bool(args.resume), **train_settings(args))
        return 0
    if len(gpus) > 1 and "LOCAL_RANK" not in os.environ:  # the reference's --device 0,1: one process per GPU
        check_gpu_list(gpus)
        return subprocess.call(launch_command(len(gpus), args.argv))
    train(args.config, hyp=args.hyp, resume=args.resume, **train_settings(args))
    return 0


def train_settings(args: argparse.Namespace) -> dict[str, object]:
    """The settings of parsed ``train`` options, with the reference's spellings (``--cfg``, ``--weights``, and
    ``--weights ''`` for none) turned into yolotrain's; an unsupported reference option, or a model option
    that contradicts another, is a ``ValueError`` saying why."""
    check_refused(args, UNSUPPORTED_TRAIN_OPTIONS)
    settings = {k: v for k, v in vars(args).items()
                if k not in ("command", "run", "config", "hyp", "resume", "cfg", "local_rank", "argv", "evolve")}
    batch = settings.get("batch_size")
    if batch == -1 or (isinstance(batch, float) and 0 < batch < 1):  # AutoBatch at the reference's or this fraction
        settings["autobatch"] = DEFAULT_FRACTION if batch == -1 else settings.pop("batch_size")
        settings.pop("batch_size", None)
    return model_settings(settings, args.cfg)


def _val_parser(sub: argparse._SubParsersAction) -> None:
    add_val_arguments(sub.add_parser("val", help="evaluate weights on a dataset (P, R, mAP)"))
    sub.choices["val"].set_defaults(run=run_val)


def _predict_parser(sub: argparse._SubParsersAction) -> None:
    add_predict_arguments(sub.add_parser("predict", help="detect objects in images, folders or videos"))
    sub.choices["predict"].set_defaults(run=run_predict)


def _track_parser(sub: argparse._SubParsersAction) -> None:
    add_track_arguments(sub.add_parser("track", help="follow objects through videos and streams (ByteTrack, BoT-SORT)"))
    sub.choices["track"].set_defaults(run=run_track)


def _export_parser(sub: argparse._SubParsersAction) -> None:
    add_export_arguments(sub.add_parser(
        "export", help="export weights to ONNX, OpenVINO, LiteRT, Core ML, TensorRT or TorchScript"))
    sub.choices["export"].set_defaults(run=run_export)


def _tune_parser(sub: argparse._SubParsersAction) -> None:
    add_tune_arguments(sub.add_parser(
        "tune", help="search hyper-parameters with Optuna: trials shared by processes on one or many machines"))


def _data_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="dataset tools")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    check = data_sub.add_parser("check", help="verify a dataset, preview augmented images, plot label statistics")
    check.add_argument("data", help="dataset YAML or folder")
    check.add_argument("--out", default="runs/data", help="folder for the preview and statistics images")
    check.add_argument("--img", dest="img_size", type=int, help="image size of the preview (default: 640; 224 for "
                       "class folders)")
    check.set_defaults(run=_run_data_check)
    shapes = data_sub.add_parser("shapes", help="make the built-in synthetic dataset and print its folder")
    shapes.add_argument("--root", help="parent folder (default: the yolotrain cache folder)")
    shapes.add_argument("--n-train", type=int, default=160, help="training images")
    shapes.add_argument("--n-val", type=int, default=40, help="validation images")
    shapes.add_argument("--img-size", type=int, default=256, help="side of the square images")
    shapes.add_argument("--seed", type=int, default=0, help="seed of the shapes, colours and positions")
    shapes.add_argument("--labels", choices=list(LABEL_KINDS), default="polygons",
                        help="what the labels hold: polygons (detection, segmentation), pose (boxes with four "
                             "keypoints) or obb (objects turned by any angle, their rotated boxes)")
    shapes.set_defaults(run=_run_data_shapes)
    split = data_sub.add_parser("split", help="cut large oriented-box images (DOTA) into overlapping tiles with "
                                "their labels, as a new dataset")
    split.add_argument("data", help="dataset YAML or folder (DOTA-style rows: class x1 y1 ... x4 y4)")
    split.add_argument("--out", required=True, help="folder of the tiled dataset (its data.yaml is printed)")
    split.add_argument("--size", type=int, default=TILE_SIZE, help="tile side, px")
    split.add_argument("--gap", type=int, default=TILE_GAP, help="overlap of neighbouring tiles, px")
    split.add_argument("--min-share", type=float, default=MIN_SHARE,
                       help="share of a label's area a tile must hold to keep it")
    split.set_defaults(run=_run_data_split)


def _run_data_check(args: argparse.Namespace) -> int:
    check_dataset(args.data, args.out, img_size=args.img_size)
    return 0


def _run_data_shapes(args: argparse.Namespace) -> int:
    print(generate_shapes_dataset(args.root, args.n_train, args.n_val, args.img_size, args.seed, args.labels))
    return 0


def _run_data_split(args: argparse.Namespace) -> int:
    print(split_oriented_dataset(args.data, args.out, args.size, args.gap, args.min_share))
    return 0


def _info_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="a model's layers, parameters and GFLOPs",
                       description="Print a model's summary as training prints it: layers, parameters, gradients and "
                       "GFLOPs of one image at the model's default input size (640; 1280 for P6 models, 224 for "
                       "classifiers).")
    p.add_argument("model", help="an architecture name (yolov5n, yolov5s-seg, yolov5n-cls, resnet18), a model YAML "
                   "or weights")
    p.add_argument("--img", "--img-size", "--imgsz", dest="img_size", type=int,
                   help="input size the GFLOPs and output shapes are computed at (default: the model's)")
    p.add_argument("--verbose", action="store_true", help="also a table of the layers: inputs, parameters, module "
                   "and output shape")
    p.set_defaults(run=_run_info)


def _run_info(args: argparse.Namespace) -> int:
    model = resolve_model(args.model)
    if not task_of(model).is_pytorch_model(model):
        raise ValueError(f"{args.model}: an exported model; info describes PyTorch models (give the checkpoint it "
                         "was exported from)")
    if args.img_size is not None and args.img_size < 1:
        raise ValueError(f"--img must be a positive number of pixels, got {args.img_size}")
    size = args.img_size or model.default_img_size
    if args.verbose:
        print(layer_table(model, size, model.in_channels))
    print(summarise(model, model.arch_name, size, model.in_channels))
    return 0


PARSERS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _train_parser, _tune_parser, _val_parser, _predict_parser, _track_parser, _export_parser, _data_parser,
    _info_parser)


# Commands whose options are generated from typed settings: they also take them as key=value (data=coco.yaml).
KEY_VALUE_COMMANDS = ("train", "tune", "val", "predict", "track", "export")
_KEY_VALUE = re.compile(r"([A-Za-z][\w-]*)=(.*)", re.DOTALL)
_TRUTH = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


class CommandParser(argparse.ArgumentParser):
    """The parser of ``yolotrain`` and its commands: options are spelt in full (``--epoch`` is not taken as
    ``--epochs``), a misspelt one is answered with the closest, settings may be given as ``key=value``, and an
    error is one line (the usage of ``train`` alone is dozens; ``--help`` shows it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        unknown = [token for token in getattr(self, "_given", ()) if token.startswith("--")
                   and token.partition("=")[0] not in self._option_string_actions]
        if unknown and message.startswith("the following arguments are required"):
            message = self._unrecognized(unknown)  # a misspelt required option: the misspelling is the news
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self._given, namespace)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        argv = self._options_of_settings(list(sys.argv[1:] if args is None else args))
        parsed, extras = self.parse_known_args(argv, namespace)
        parser = self._command_parser(parsed)
        if extras:
            parser.error(parser._unrecognized(extras))
        if (twice := _one_option_spelt_twice(parser, argv)) is not None:
            parser.error(twice)
        return parsed

    def _unrecognized(self, extras: list[str]) -> str:
        """``unrecognized arguments: ...``, with the option of this parser closest to the first unknown one."""
        option = next((extra.partition("=")[0] for extra in extras if extra.startswith("-")), None)
        known = [flag for action in self._actions if action.help != argparse.SUPPRESS
                 for flag in action.option_strings if flag.startswith("--")]
        close = closest_name(option, known) if option else None
        hint = f"; did you mean {close}?" if close else ""
        return f"unrecognized arguments: {' '.join(extras)}{hint}"

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The parser of the (sub)command given, whose options an unrecognised one is compared with."""
        parser: argparse.ArgumentParser = self
        while True:
            commands = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            chosen = commands.choices.get(getattr(parsed, commands.dest, None)) if commands else None
            if chosen is None:
                return parser
            parser = chosen

    def _options_of_settings(self, argv: list[str]) -> list[str]:
        """``key=value`` arguments of a settings command as its options: ``epochs=3`` is ``--epochs 3``,
        ``img_size=320`` ``--img-size 320``, ``rect=true`` ``--rect`` and ``rect=false`` ``--no-rect``, a list
        ``freeze=0,1`` ``--freeze 0 1``. A token that is an existing file, or the value an option before it
        takes, is left as it is."""
        commands = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
        if commands is None or not argv or argv[0] not in KEY_VALUE_COMMANDS:
            return argv
        parser = commands.choices[argv[0]]
        expanded, takes_value = argv[:1], False
        for index, token in enumerate(argv[1:], 1):
            if token == "--":
                return expanded + argv[index:]
            match = _KEY_VALUE.fullmatch(token)
            if match and not takes_value and not Path(token).exists():
                expanded += _setting_options(parser, match[1], match[2])
                continue
            expanded.append(token)
            action = parser._option_string_actions.get(token)
            takes_value = action is not None and action.nargs is None
        return expanded


def _one_option_spelt_twice(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The error for an option given under two of its spellings (``--weights a.pt --model b.pt``, ``--img 320
    --imgsz 640``), else None: which one would win is the order of the line, not what its writer meant. The same
    spelling twice is left to argparse (the last wins), and so are a switch and its ``--no-`` form."""
    first_spelling: dict[argparse.Action, str] = {}
    for token in argv:  # argparse takes no token spelt as an option for a value, so each such token is one
        flag = token.partition("=")[0]
        action = parser._option_string_actions.get(flag)
        if action is None or isinstance(action, argparse.BooleanOptionalAction):
            continue
        first = first_spelling.setdefault(action, flag)
        if first != flag:
            return f"{first} and {flag} are two spellings of one option: give it once"
    return None


def _setting_options(parser: argparse.ArgumentParser, key: str, value: str) -> list[str]:
    """The options ``key=value`` stands for (see :meth:`CommandParser._options_of_settings`)."""
    flags = dict.fromkeys(f"--{name}" for name in (key, key.replace("_", "-"), key.replace("-", "_")))
    flag = next((f for f in flags if f in parser._option_string_actions), None)
    if flag is None:
        # Both spellings, so that the closest is in the one the user writes (conf_thres, or conf-thres).
        known = [name for f in parser._option_string_actions if f.startswith("--")
                 for name in dict.fromkeys((f[2:], f[2:].replace("-", "_")))]
        parser.error(f"{key}={value}: {unknown_name_error(key, known)}")
    action = parser._option_string_actions[flag]
    if action.nargs == 0 or (action.nargs == "?" and value.lower() in _TRUTH):  # a switch
        if value.lower() not in _TRUTH:
            parser.error(f"{key}={value}: expected true or false")
        on = _TRUTH[value.lower()]
        if isinstance(action, argparse.BooleanOptionalAction):
            return [flag if on else f"--no-{flag[2:]}"]
        return [flag] if on else []
    if action.nargs in ("+", "*"):
        return [flag, *(part for part in value.split(",") if part)]
    return [f"{flag}={value}"]


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="yolotrain", description="Train, validate, predict, track, tune and export YOLO models "
                           "(detection, segmentation, classification); find the line behind autograd errors.")
    parser.add_argument("--version", action="version", version=f"yolotrain {version('yolotrain')}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in PARSERS:
        add(sub)
    # `doctor` parses its own arguments: everything after SCRIPT belongs to the script.
    sub.add_parser("doctor", help="find the lines that broke backward() (in-place write, freed graph)", add_help=False)
    return parser


@contextlib.contextmanager
def opencv_log_lines(shown: bool) -> Iterator[None]:
    """OpenCV's own log lines (each camera backend's failed probe, FFmpeg's errors) kept out of the terminal
    unless ``shown`` (``--verbose``): the command says what went wrong in its own one line."""
    if shown:
        yield
        return
    previous = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    try:
        yield
    finally:
        cv2.utils.logging.setLogLevel(previous)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:  # the console script sends `doctor` there itself, before importing this module
        return doctor_main(argv[1:])
    args = build_parser().parse_args(argv)
    args.argv = argv  # what a launcher of several processes passes on to each
    try:
        with one_line_warnings(f"yolotrain {args.command}"), opencv_log_lines(getattr(args, "verbose", False)):
            return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("yolotrain: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS + DOMAIN_ERRORS as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        return _error_line(f"yolotrain {args.command}: error: {shorten(str(message))}")
    except ImportError as error:  # a package an optional part needs is missing: ours name the extra to install
        return _error_line(f"yolotrain {args.command}: error: {shorten(str(error))}")
    except OSError as error:
        if error.errno != errno.ENAMETOOLONG:
            raise
        return _error_line(f"yolotrain {args.command}: error: {shorten(str(error.filename or error))}: file name "
                           "too long (shorten --name, --project or the file names given)")


def _error_line(line: str) -> int:
    """Print the one-line error (under torchrun, also for the agent's failure summary); the exit code."""
    print(line, file=sys.stderr)
    record_error_for_agent(line)
    return 1
