"""PaddlePaddle (a ``*_paddle_model`` folder), Baidu's framework: X2Paddle translates the traced TorchScript graph
into a Paddle inference model (:mod:`._paddle_convert`, a child process with network connections refused), the
decoded outputs of every task, fixed at batch 1 and the export's size, float32. :class:`PaddleModel` runs it with
``paddle.inference`` on the CPU.

The folder holds the model as ultralytics lays it out (``inference_model/model.json``, the program, with its
``model.pdiparams`` weights) and ``metadata.yaml``: the fields ultralytics' ``AutoBackend`` reads, and ours under a
key of its own (``yolotrain``). No other JSON file goes in the folder: ``AutoBackend`` takes the first ``*.json``
it finds in it for the program. A Paddle program is a list of Paddle's operators, and those include ones that
write and read files (``save_combine``, ``load_combine``): loading one needs the user's trust (:mod:`..trust`), as
a TensorFlow graph does."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from ...checkpoint import CheckpointError
from ..exporting.graph import BOXES, LOGITS, MASK_PROTOTYPES
from ..runtime import ExportedModel
from ..trust import require_trust
from . import ExportFormat
from ._common import MAX_METADATA_BYTES, ExportJob, quiet_output, run_converter, staged

EXTRA = "pip install 'yolotrain[paddle]'"
SUFFIX = "_paddle_model"
# The metadata file (the fields other tools read, and ours under its key), and the model (its program and
# weights), inside the folder.
METADATA_FILE = "metadata.yaml"
METADATA_KEY = "yolotrain"
MODEL_FOLDER = "inference_model"
PROGRAM_FILE = "model.json"
WEIGHTS_FILE = "model.pdiparams"
RUNS_CODE = ("a Paddle program's operators can write and read files (save_combine, load_combine) and run whatever "
             "Paddle can")
_CONVERTER = Path(__file__).with_name("_paddle_convert.py")
# Modules whose native libraries, once loaded, make Paddle 3.3's own crash the process as it loads (a segmentation
# fault in paddle.base.core, whichever is imported first of those and torch).
CLASHING_MODULES = frozenset({"tensorflow", "coremltools"})


def unavailable() -> str | None:
    """Why Paddle exports cannot be written here (X2Paddle or Paddle missing), or None."""
    missing = [name for name in ("paddle", "x2paddle") if importlib.util.find_spec(name) is None]
    return f"PaddlePaddle export needs {', '.join(missing)} ({EXTRA})" if missing else None


def write(job: ExportJob) -> None:
    if (missing := unavailable()) is not None:
        raise ImportError(missing)
    with tempfile.TemporaryDirectory(prefix="yolotrain-paddle-") as scratch, staged(job.out) as path:
        work = Path(scratch)
        traced = work / "model.torchscript"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
            torch.jit.save(torch.jit.trace(job.graph, job.example, strict=False, check_trace=False), str(traced))
        # X2Paddle writes Paddle code, its pickled parameters and the inference model: the export keeps the last.
        converted = work / "x2paddle"
        shape = ",".join(str(side) for side in job.example.shape)
        command = [sys.executable, str(_CONVERTER), str(traced), shape, str(converted)]
        model = converted / MODEL_FOLDER
        run_converter(command, "X2Paddle could not convert the model to PaddlePaddle",
                      lambda _: (model / PROGRAM_FILE).is_file() and (model / WEIGHTS_FILE).is_file(), work)
        path.mkdir()
        shutil.move(model, path / MODEL_FOLDER)
        metadata = {**job.interop_metadata, METADATA_KEY: job.metadata}
        (path / METADATA_FILE).write_text(yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True),
                                          encoding="utf-8")


def read_metadata(path: Path) -> dict[str, str]:
    """Our metadata, from its key in the folder's metadata file (read as data); ``{}`` when the file holds none or
    is larger than any metadata of ours."""
    source = path / METADATA_FILE
    if source.stat().st_size > MAX_METADATA_BYTES:
        return {}
    try:
        metadata = yaml.safe_load(source.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ValueError(f"{source}: not YAML") from error
    ours = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    return ours if isinstance(ours, dict) else {}


def paddle_inference() -> Any:
    """``paddle.inference``, imported with its load-time notes (a compiler cache it looks for) kept quiet."""
    if importlib.util.find_spec("paddle") is None:
        raise ImportError(f"PaddlePaddle models need the 'paddlepaddle' package ({EXTRA})")
    if "paddle" not in sys.modules and (clashing := sorted(CLASHING_MODULES & sys.modules.keys())):
        raise ImportError(f"PaddlePaddle cannot be loaded into a process that has loaded {', '.join(clashing)} (its "
                          "native library crashes there): run the Paddle model in a process of its own")
    with warnings.catch_warnings(), quiet_output((2,)):
        warnings.simplefilter("ignore")
        import paddle.inference
    return paddle.inference


class PaddleModel(ExportedModel):
    """A Paddle inference model written by :func:`~yolotrain.interop.exporting.exporter.export`, run by
    ``paddle.inference`` on the CPU, one image at a time at the export's size. Refused unless ``trust_code``
    (see :mod:`..trust`)."""

    format_name = "PaddlePaddle"

    def __init__(self, path: str | os.PathLike, trust_code: bool = False) -> None:
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: no such PaddlePaddle model folder")
        require_trust(path, trust_code)
        program, weights = path / MODEL_FOLDER / PROGRAM_FILE, path / MODEL_FOLDER / WEIGHTS_FILE
        for file, what in ((program, "program"), (weights, "weights")):
            if not file.is_file():
                raise CheckpointError(f"{path}: its {what} file {MODEL_FOLDER}/{file.name} is missing")
        try:
            metadata = read_metadata(path)
        except (OSError, ValueError):
            metadata = {}
        size = json.loads(metadata["img_size"]) if "img_size" in metadata else [None, None]
        super().__init__(path, metadata, [1, 3, *size])
        inference = paddle_inference()
        config = inference.Config(str(program), str(weights))
        config.disable_gpu()
        config.disable_glog_info()
        # Paddle 3.3's oneDNN kernels cannot run nearest upsampling, whether by scale or by size, in any saved program
        # ("ConvertPirAttribute2RuntimeAttribute not support [pir::ArrayAttribute<pir::DoubleAttribute>]"): Paddle's
        # own CPU kernels run it.
        config.disable_mkldnn()
        try:
            with quiet_output((2,)):
                self._predictor = inference.create_predictor(config)
        except (RuntimeError, ValueError, OSError) as exc:
            message = str(exc).strip().splitlines()
            raise CheckpointError(f"{path}: not a loadable PaddlePaddle model "
                                  f"({message[0] if message else type(exc).__name__})") from None
        self._input = self._predictor.get_input_handle(self._predictor.get_input_names()[0])
        self._outputs = [self._predictor.get_output_handle(name) for name in self._predictor.get_output_names()]

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        self._input.reshape(list(images.shape))
        self._input.copy_from_cpu(np.ascontiguousarray(images, dtype=np.float32))
        self._predictor.run()
        return [output.copy_to_cpu() for output in self._outputs]


FORMAT = ExportFormat(name="paddle", suffix=SUFFIX, title="PaddlePaddle", write=write, read_metadata=read_metadata,
                      outputs=frozenset({BOXES, MASK_PROTOTYPES, LOGITS}), exact_suffix=True, runtime=PaddleModel,
                      runs_code=RUNS_CODE, unavailable=unavailable, extra=EXTRA)
