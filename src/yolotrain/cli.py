"""``yolotrain`` command line: argument parsing over the Python API, one-line errors."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

# Exceptions that mean "bad input or configuration": printed as one line, no traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (FileNotFoundError, NotADirectoryError, PermissionError,
                                                 ValueError, KeyError)


def _train_parser(sub: argparse._SubParsersAction) -> None:
    from .engine.config import TrainConfig
    from .settings import add_arguments

    p = sub.add_parser("train", help="train a detector (default: yolov5n on the built-in shapes dataset)",
                       description="Train a detector. Settings not given follow the data: the built-in shapes "
                       "dataset gets a quick CPU recipe, real datasets the reference YOLOv5 one.")
    p.add_argument("--config", help="a run's config.yaml (nested settings) to start from")
    p.add_argument("--hyp", help="hyper-parameter YAML (flat: lr0, mosaic, box ...) over the defaults")
    p.add_argument("--resume", nargs="?", const=True, default=False,
                   help="continue the latest run, or the given run folder or last checkpoint, with its own "
                   "settings (only --device and --workers may change)")
    add_arguments(p, TrainConfig)
    p.set_defaults(run=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from .engine import train

    settings = {k: v for k, v in vars(args).items() if k not in ("command", "run", "config", "hyp", "resume")}
    train(args.config, hyp=args.hyp, resume=args.resume, **settings)
    return 0


def _val_parser(sub: argparse._SubParsersAction) -> None:
    from .eval.val import add_val_arguments, run_val

    add_val_arguments(sub.add_parser("val", help="evaluate weights on a dataset (P, R, mAP)"))
    sub.choices["val"].set_defaults(run=run_val)


def _predict_parser(sub: argparse._SubParsersAction) -> None:
    from .eval.predict import add_predict_arguments, run_predict

    add_predict_arguments(sub.add_parser("predict", help="detect objects in images, folders or videos"))
    sub.choices["predict"].set_defaults(run=run_predict)


def _export_parser(sub: argparse._SubParsersAction) -> None:
    from .interop.export import add_export_arguments, run_export

    add_export_arguments(sub.add_parser("export", help="export weights to ONNX or TorchScript"))
    sub.choices["export"].set_defaults(run=run_export)


def _data_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="dataset tools")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    check = data_sub.add_parser("check", help="verify a dataset, preview augmented images, plot label statistics")
    check.add_argument("data", help="dataset YAML or folder")
    check.add_argument("--out", default="runs/data", help="folder for the preview and statistics images")
    check.add_argument("--img", dest="img_size", type=int, default=640, help="image size of the preview")
    check.set_defaults(run=_run_data_check)


def _run_data_check(args: argparse.Namespace) -> int:
    from .data.check import check_dataset

    check_dataset(args.data, args.out, img_size=args.img_size)
    return 0


PARSERS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _train_parser, _val_parser, _predict_parser, _export_parser, _data_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="yolotrain", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in PARSERS:
        add(sub)
    # `doctor` parses its own arguments: everything after SCRIPT belongs to the script.
    sub.add_parser("doctor", help="find the in-place operation that broke backward()", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        from .doctor.cli import main as doctor_main

        return doctor_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("yolotrain: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS + _domain_errors() as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"yolotrain {args.command}: error: {message}", file=sys.stderr)
        return 1


def _domain_errors() -> tuple[type[BaseException], ...]:
    from .checkpoint import CheckpointError
    from .engine.loggers import LoggerError
    from .engine.trainer import TrainingError
    from .interop import UnsafeCheckpointError
    from .loss import DivergenceError

    return (CheckpointError, TrainingError, UnsafeCheckpointError, DivergenceError, LoggerError)
