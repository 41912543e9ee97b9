"""TF.js graph model (a ``*_web_model`` folder: ``model.json`` and its weight shards), converted by the
``tensorflowjs`` package's ``tensorflowjs_converter`` from the SavedModel we write (:mod:`.saved_model`): the decoded
outputs of every task, fixed at batch 1 and the export's size, float32, NHWC input. :class:`TfjsModel` runs it under
Node with TF.js (``tfjs_runner.js`` beside this module, one child process per loaded model).

``tensorflowjs`` 4.22 cannot share an environment with ours (it pins TensorFlow 2.19, numpy<2.2 and protobuf<6), so
its converter runs as a program of its own: ``$YOLOTRAIN_TFJS_CONVERTER`` (the path of ``tensorflowjs_converter`` in
an environment of its own), else ``.venv-tfjs/bin/tensorflowjs_converter`` in the working folder (where ``make``
installs it), else ``tensorflowjs_converter`` on the ``PATH``. It runs with network connections refused (the
start-up module in ``_offline``). The runtime needs ``node`` on the ``PATH`` and a ``node_modules`` folder holding
``@tensorflow/tfjs-core``, ``-converter``, ``-backend-cpu`` and (faster, optional) ``-backend-wasm``:
``$YOLOTRAIN_TFJS_NODE_MODULES``, else ``.node-tfjs/node_modules`` in the working folder (where ``make`` installs
it from ``tools/tfjs-node``).

The folder holds our metadata (``yolotrain.json``) and the fields ultralytics reads from a web model folder
(``metadata.yaml``). A graph model holds TensorFlow operations that TF.js runs on tensors only (TF.js has no
operation that reads or writes files), so loading one needs no trust."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
import weakref
from pathlib import Path
from typing import IO

import numpy as np
import yaml

from ...checkpoint import CheckpointError
from ..exporting.graph import BOXES, LOGITS, MASK_PROTOTYPES
from ..runtime import ExportedModel
from . import ExportFormat
from ._common import ExportJob, json_metadata_or_empty, read_json_metadata, run_converter, staged
from ._tensorflow import convert, to_channels_first, to_channels_last
from ._tensorflow import unavailable as tensorflow_unavailable
from .saved_model import METADATA_FILE, SIGNATURE, TOOLS_METADATA_FILE

SUFFIX = "_web_model"
MODEL_FILE = "model.json"
CONVERTER_ENV = "YOLOTRAIN_TFJS_CONVERTER"
NODE_MODULES_ENV = "YOLOTRAIN_TFJS_NODE_MODULES"
DEFAULT_CONVERTER = Path(".venv-tfjs") / "bin" / "tensorflowjs_converter"
DEFAULT_NODE_MODULES = Path(".node-tfjs") / "node_modules"
NODE_PACKAGES = ("@tensorflow/tfjs-core@4.22.0 @tensorflow/tfjs-converter@4.22.0 @tensorflow/tfjs-backend-cpu@4.22.0 "
                 "@tensorflow/tfjs-backend-wasm@4.22.0")
CONVERTER_INSTALL = ("python3 -m venv .venv-tfjs && .venv-tfjs/bin/pip install tensorflowjs==4.22.0 ydf==0.12.0 "
                     f"(`make .venv-tfjs/.installed` does it), then run from the folder holding .venv-tfjs or set "
                     f"{CONVERTER_ENV}=.venv-tfjs/bin/tensorflowjs_converter")
NODE_INSTALL = (f"`npm install --prefix .node-tfjs {NODE_PACKAGES}` (`make .node-tfjs/.installed` does it), "
                f"or set {NODE_MODULES_ENV} to a node_modules folder holding them")
# Longest the converter takes on the largest published model's SavedModel on a 2-core CPU, with room to spare.
CONVERT_TIMEOUT_S = 600
# Longest Node takes to start, load TF.js and the model.
LOAD_TIMEOUT_S = 120
_RUNNER = Path(__file__).with_name("tfjs_runner.js")
_OFFLINE = Path(__file__).with_name("_offline")
_UINT32 = struct.Struct("<I")


def converter_path() -> Path | None:
    """The ``tensorflowjs_converter`` program an export runs, or None when there is none."""
    configured = os.environ.get(CONVERTER_ENV)
    if configured:
        # Resolved here: the converter runs in a scratch working folder.
        return Path(configured).resolve() if _is_program(Path(configured)) else None
    if _is_program(DEFAULT_CONVERTER):
        return DEFAULT_CONVERTER.resolve()
    found = shutil.which("tensorflowjs_converter")
    return Path(found) if found else None


def _is_program(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def unavailable() -> str | None:
    """Why TF.js exports cannot be written here (TensorFlow's converter packages or TF.js's converter missing)."""
    if (missing := tensorflow_unavailable()) is not None:
        return missing
    if converter_path() is None:
        configured = os.environ.get(CONVERTER_ENV)
        where = (f"{CONVERTER_ENV}={configured} is not an executable file" if configured
                 else f"{CONVERTER_ENV} is not set, and neither {DEFAULT_CONVERTER} nor the PATH has one")
        return f"TF.js export needs tensorflowjs_converter in an environment of its own ({where}): {CONVERTER_INSTALL}"
    return None


def write(job: ExportJob) -> None:
    if (missing := unavailable()) is not None:
        raise ImportError(missing)
    with tempfile.TemporaryDirectory(prefix="yolotrain-tfjs-") as scratch:
        saved_model = Path(scratch) / "model_saved_model"
        convert(job, "tfjs_saved_model", saved_model)
        with staged(job.out) as path:
            _run_converter(saved_model, path, Path(scratch))
            (path / METADATA_FILE).write_text(json.dumps(job.metadata), encoding="utf-8")
            (path / TOOLS_METADATA_FILE).write_text(
                yaml.safe_dump(job.interop_metadata, sort_keys=False, allow_unicode=True), encoding="utf-8")


def _run_converter(saved_model: Path, output: Path, scratch: Path) -> None:
    """``tensorflowjs_converter`` turning ``saved_model`` into a graph model at ``output``, offline, in a process
    that sees none of this environment's packages."""
    command = [str(converter_path()), "--input_format=tf_saved_model", "--output_format=tfjs_graph_model",
               f"--signature_name={SIGNATURE}", "--saved_model_tags=serve", str(saved_model), str(output)]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    environment.update(PYTHONPATH=str(_OFFLINE), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    run_converter(command, "tensorflowjs_converter could not convert the SavedModel to TF.js",
                  lambda _: (output / MODEL_FILE).is_file(), scratch, env=environment, timeout_s=CONVERT_TIMEOUT_S)


def read_metadata(path: Path) -> dict[str, str]:
    """Our metadata, from the JSON file in the web model folder."""
    return read_json_metadata(path / METADATA_FILE)


def node_modules() -> Path:
    """The ``node_modules`` folder the runtime loads TF.js from."""
    return Path(os.environ.get(NODE_MODULES_ENV) or DEFAULT_NODE_MODULES)


def node_unavailable() -> str | None:
    """Why TF.js models cannot run here (Node or TF.js's packages missing), or None."""
    if shutil.which("node") is None:
        return "TF.js models run under Node: no `node` on the PATH (install Node.js, e.g. version 20)"
    modules = node_modules()
    if not all((modules / "@tensorflow" / name / "package.json").is_file() for name in ("tfjs-core", "tfjs-converter")):
        return f"TF.js models run under Node with TF.js's packages, which {modules} lacks: {NODE_INSTALL}"
    return None


def _signature_shape(info: dict) -> list[int]:
    return [int(dim["size"]) for dim in info["tensorShape"]["dim"]]


def _stop(process: subprocess.Popen, stderr: IO[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()
    stderr.close()


class TfjsModel(ExportedModel):
    """A TF.js graph model written by :func:`~yolotrain.interop.exporting.exporter.export`, run under Node by TF.js
    (its WebAssembly backend when installed, else its JavaScript one) in a child process that lives as long as this
    object, one image at a time at the export's size."""

    format_name = "TF.js"

    def __init__(self, path: str | os.PathLike) -> None:
        path = Path(path)
        if not (path / MODEL_FILE).is_file():
            raise CheckpointError(f"{path}: no TF.js model folder ({MODEL_FILE} missing)")
        try:
            model_json = json.loads((path / MODEL_FILE).read_text(encoding="utf-8"))
            inputs = model_json["signature"]["inputs"]
            input_shape = _signature_shape(next(iter(inputs.values())))
        except (OSError, ValueError, KeyError, TypeError, StopIteration, AttributeError) as exc:
            raise CheckpointError(f"{path}: {MODEL_FILE} is not a TF.js graph model with a signature "
                                  f"({type(exc).__name__}: {str(exc).strip()[:200]})") from None
        metadata = json_metadata_or_empty(path / METADATA_FILE)
        if len(input_shape) != 4:
            raise CheckpointError(f"{path}: its graph takes a {len(input_shape)}-D input, not NHWC images")
        batch, height, width, channels = input_shape
        super().__init__(path, metadata, [batch, channels, height, width])
        if (missing := node_unavailable()) is not None:  # a command line's one-line error, as TensorRT's
            raise CheckpointError(f"{path}: {missing}")
        self._stderr = tempfile.TemporaryFile()
        environment = dict(os.environ, NODE_PATH=str(node_modules().resolve()))
        self._process = subprocess.Popen(["node", str(_RUNNER), str(path.resolve())], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._stderr, env=environment)
        self._finalizer = weakref.finalize(self, _stop, self._process, self._stderr)
        try:
            description = json.loads(self._read(self._read_count()))
        except (RuntimeError, ValueError) as exc:
            self._finalizer()
            raise CheckpointError(f"{path}: TF.js could not load the model ({exc})") from None
        self.backend: str = description["backend"]

    def _read_count(self) -> int:
        return _UINT32.unpack(self._read(_UINT32.size))[0]

    def _read(self, size: int) -> bytes:
        data = self._process.stdout.read(size)
        if len(data) < size:
            raise RuntimeError(self._failure())
        return data

    def _failure(self) -> str:
        """The line the runner wrote before it stopped."""
        self._process.wait(timeout=LOAD_TIMEOUT_S)
        self._stderr.seek(0)
        lines = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else f"Node stopped with exit status {self._process.returncode}"

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        image = to_channels_last(images.astype(np.float32, copy=False))
        try:
            self._process.stdin.write(_UINT32.pack(image.nbytes) + image.tobytes())
            self._process.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(self._failure()) from None
        outputs = []
        for _ in range(self._read_count()):
            rank = self._read_count()
            shape = struct.unpack(f"<{rank}I", self._read(4 * rank))
            # A copy: an array over the bytes read would be read-only, which torch.from_numpy warns of.
            outputs.append(np.frombuffer(self._read(4 * int(np.prod(shape))), dtype="<f4").reshape(shape).copy())
        return to_channels_first(outputs)

    def close(self) -> None:
        """Stop the Node process (done anyway when this object goes)."""
        self._finalizer()


FORMAT = ExportFormat(name="tfjs", suffix=SUFFIX, title="TF.js", write=write, read_metadata=read_metadata,
                      outputs=frozenset({BOXES, MASK_PROTOTYPES, LOGITS}), exact_suffix=True, runtime=TfjsModel,
                      unavailable=unavailable, extra=CONVERTER_INSTALL)
