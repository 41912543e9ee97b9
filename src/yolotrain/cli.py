"""``yolotrain`` command line: argument parsing over the Python API, one-line errors."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from .runs import add_run_dir_arguments

# Exceptions that mean "bad input or configuration": printed as one line, no traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (FileNotFoundError, NotADirectoryError, PermissionError,
                                                 ValueError, KeyError)


def _train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a detector (default: yolov5n on the built-in shapes dataset)")
    p.add_argument("--data", help="dataset YAML or folder (default: the built-in shapes dataset)")
    p.add_argument("--model", default="yolov5n", help="yolov5n|s|m|l|x, or a checkpoint to fine-tune")
    p.add_argument("--img", "--img-size", dest="img_size", type=int, help="image size (default 640; 160 on shapes)")
    p.add_argument("--epochs", type=int, help="epochs (default 100; 30 on shapes)")
    p.add_argument("--batch", "--batch-size", dest="batch_size", type=int, help="global batch size (default 16)")
    p.add_argument("--optimizer", choices=("SGD", "Adam", "AdamW"), help="default SGD (AdamW on shapes)")
    p.add_argument("--lr0", type=float, help="initial learning rate (default 1e-2 SGD, 1e-3 Adam/AdamW; "
                   "2e-3 on shapes)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: a GPU when present)")
    p.add_argument("--workers", type=int, help="data loader processes per training process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rect", action="store_true", help="rectangular batches (no mosaic)")
    p.add_argument("--close-mosaic", type=int, default=0, help="turn mosaic off for the last N epochs")
    p.add_argument("--cos-lr", action="store_true", help="cosine learning-rate schedule")
    p.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm across processes (CUDA)")
    p.add_argument("--nominal-batch", type=int,
                   help="accumulate gradients up to this batch size (default 64; 16 on shapes)")
    p.add_argument("--hyp", dest="hyp_file", help="hyper-parameter YAML overriding the defaults")
    p.add_argument("--resume", nargs="?", const=True, default=False,
                   help="continue the latest run, or the run of the given last checkpoint")
    add_run_dir_arguments(p, "runs/train")
    p.add_argument("--doctor", action="store_true", help="run the first step under the in-place doctor")
    p.add_argument("--no-val", dest="val", action="store_false", help="skip validation (saves time)")
    p.set_defaults(run=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from .engine import TrainConfig, train

    fields = {k: v for k, v in vars(args).items() if k not in ("command", "run")}
    train(TrainConfig(**fields))
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
    check.add_argument("--img", dest="img_size", type=int, default=640)
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
    from .engine.trainer import TrainingError
    from .interop import UnsafeCheckpointError
    from .loss import DivergenceError

    return (CheckpointError, TrainingError, UnsafeCheckpointError, DivergenceError)
