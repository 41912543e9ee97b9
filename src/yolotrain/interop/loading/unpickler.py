"""Read pickled PyTorch files (``torch.save`` zip archives or bare pickles) without running pickled code.

A pickle names the callables that rebuild its objects (``module.qualname``) and the unpickler calls
them, which is how a crafted ``.pt`` file runs ``os.system``. ``RestrictedUnpickler.find_class``
resolves only:

- plain containers (``OrderedDict``, ``set`` ...) and the tensor rebuild functions, re-implemented
  here from raw bytes (no torch storage machinery runs);
- classes of known model code (the reference's ``models.*``, ``torch.nn`` modules, numpy scalars,
  Ultralytics' ``ultralytics.*`` models, read by :mod:`.ultralytics`) as inert :class:`PickledObject` placeholders
  that only record their constructor arguments and state; ``builtins.getattr`` on such a placeholder
  (how a pickle names a method, such as the ``Detect.forward`` a reference ``Segment`` head keeps) gives
  another placeholder, and is refused on anything else;

and refuses every other name with :class:`UnsafeCheckpointError`, before anything is called.
"""

from __future__ import annotations

import _compat_pickle
import collections
import io
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...checkpoint import CheckpointError

# Modules (and their submodules) whose classes are replaced by placeholders: model code a checkpoint
# may pickle.
PLACEHOLDER_MODULES: tuple[str, ...] = (
    "models",               # ultralytics/yolov5 repository checkout
    "yolov5.models",        # the PyPI ``yolov5`` package
    "ultralytics",          # YOLOv8, YOLO11, YOLOv5u ... (its models, heads, blocks and IterableSimpleNamespace)
    "torch.nn.modules",
    # The inference transforms classify/train.py attaches to a classifier (never called here).
    "torchvision.transforms",
    "yolov5.utils.augmentations",
    "utils.augmentations",
    "numpy.core.multiarray",  # numpy scalars/arrays in training entries (e.g. ``best_fitness``)
    "numpy._core.multiarray",
)
PLACEHOLDER_NAMES: frozenset[str] = frozenset({"numpy.dtype", "numpy.ndarray", "argparse.Namespace",
                                               "pathlib.PosixPath", "pathlib.WindowsPath"})  # the paths of a run's opt

# First pickle of a file written by torch.save(..., _use_new_zipfile_serialization=False).
LEGACY_TORCH_MAGIC = 0x1950A86A20F9469CFC6C

# Legacy typed storage classes name the element type of a storage record.
_STORAGE_DTYPES: dict[str, torch.dtype] = {
    "DoubleStorage": torch.float64, "FloatStorage": torch.float32, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool, "ComplexFloatStorage": torch.complex64, "ComplexDoubleStorage": torch.complex128,
    "UntypedStorage": torch.uint8,
}


class UnsafeCheckpointError(CheckpointError):
    """The file's pickle names a callable that is neither a tensor, a container nor known model code."""


class PickledObject:
    """Inert stand-in for an instance of a pickled class: keeps the class name, arguments and state.

    It never imports or calls the class it stands for. Attribute state set by the pickle (a
    module's ``__dict__``) is available through :meth:`get`.
    """

    pickled_name: str = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def get(self, key: str, default: Any = None) -> Any:
        """An attribute from the pickled ``__dict__`` (also the dict half of a ``(dict, slots)`` state)."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
            state = state[0]
        return state.get(key, default) if isinstance(state, dict) else default

    def __repr__(self) -> str:
        return f"<pickled {self.pickled_name}>"


class _TensorType:
    """Marker for ``torch.Tensor`` / ``nn.Parameter`` named by ``_rebuild_from_type_v2``."""


class _StorageRecord:
    """Raw little-endian bytes of one ``data/<key>`` record and its element type. ``lent``: a tensor holds
    the record's memory itself (any other tensor of the record gets a copy)."""

    def __init__(self, data: bytes, dtype: torch.dtype) -> None:
        self.dtype = dtype
        # Copied into memory of torch's allocator (aligned as every tensor's), by numpy: one thread, where a
        # torch copy of a large record would start its parallel workers.
        raw = torch.empty(len(data), dtype=torch.uint8)
        np.copyto(raw.numpy(), np.frombuffer(data, np.uint8))
        self.flat = raw.view(dtype)
        self.lent = False


def _rebuild_tensor(storage: _StorageRecord, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                    requires_grad: bool = False, backward_hooks: Any = None, metadata: Any = None) -> torch.Tensor:
    """Same values as ``torch._utils._rebuild_tensor_v2``, in memory of its own: a tensor that is its whole
    record, contiguous, takes the record's memory (read for it alone); any other view is copied out. No two
    tensors share memory."""
    if not isinstance(storage, _StorageRecord):
        raise pickle.UnpicklingError(f"tensor rebuilt from {type(storage).__name__}, expected a storage record")
    try:
        view = torch.as_strided(storage.flat, tuple(size), tuple(stride), int(offset))
    except RuntimeError as exc:
        raise pickle.UnpicklingError(f"tensor view outside its storage record: {exc}") from None
    if storage.lent or not (offset == 0 and view.numel() == storage.flat.numel() > 0 and view.is_contiguous()):
        return view.clone()
    storage.lent = True
    return view


def _rebuild_parameter(data: torch.Tensor, requires_grad: bool = False, backward_hooks: Any = None,
                       state: Any = None) -> torch.Tensor:
    """Parameters come back as plain tensors: only their values are needed."""
    return data


def _rebuild_from_type(func: Callable[..., torch.Tensor], new_type: Any, args: tuple, state: Any) -> torch.Tensor:
    if func not in (_rebuild_tensor, _rebuild_parameter) or new_type is not _TensorType:
        raise pickle.UnpicklingError("tensor subclass rebuild with an unexpected function or type")
    return func(*args)


def _encode_latin1(text: str, encoding: str = "latin1") -> bytes:
    """Protocol-2 pickles store ``bytes`` as ``_codecs.encode(str, 'latin1')``."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode used for something other than latin1 bytes")
    return text.encode("latin1")


_SAFE_GLOBALS: dict[str, Any] = {
    "collections.OrderedDict": collections.OrderedDict,
    "builtins.set": set, "builtins.frozenset": frozenset,
    "builtins.slice": slice,
    "_codecs.encode": _encode_latin1,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type,
    "torch._tensor.Tensor": _TensorType, "torch.Tensor": _TensorType,
    "torch.nn.parameter.Parameter": _TensorType,
    "torch.Size": tuple,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that builds only tensors, plain containers and inert placeholders (see module doc)."""

    def __init__(self, file: io.BufferedIOBase, source: str,
                 records: Callable[[str], bytes] | None = None) -> None:
        super().__init__(file)
        self.source = source
        self._records = records
        self._storages: dict[str, _StorageRecord] = {}
        self._placeholders: dict[str, type[PickledObject]] = {}

    def find_class(self, module: str, name: str) -> Any:
        # Protocol 0-2 pickles use Python 2 names ('__builtin__'); map them as pickle itself does.
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        full = f"{module}.{name}"
        if full in _SAFE_GLOBALS:
            return _SAFE_GLOBALS[full]
        if full == "builtins.getattr":
            return self._placeholder_attribute
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        if module == "torch.storage" and name == "UntypedStorage":
            return torch.uint8
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        in_namespace = any(module == root or module.startswith(root + ".") for root in PLACEHOLDER_MODULES)
        if full in PLACEHOLDER_NAMES or (in_namespace and name.isidentifier()):
            return self._placeholder(full)
        raise UnsafeCheckpointError(
            f"{self.source}: refusing to load {full!r}: the pickle asks for a callable that is neither a tensor, "
            "a plain container nor known model code, so loading it could run arbitrary code")

    def _placeholder(self, full: str) -> type[PickledObject]:
        if full not in self._placeholders:
            self._placeholders.update({full: type(full.rpartition(".")[2], (PickledObject,), {"pickled_name": full})})
        return self._placeholders[full]

    def _placeholder_attribute(self, owner: Any, name: Any) -> type[PickledObject]:
        """``getattr(placeholder class, name)`` as a placeholder named ``owner.name``; nothing is looked up."""
        if not (isinstance(owner, type) and issubclass(owner, PickledObject) and isinstance(name, str)
                and name.isidentifier()):
            raise UnsafeCheckpointError(f"{self.source}: refusing to load 'builtins.getattr' on {owner!r:.60}: "
                                        "only attributes of known model classes are read")
        return self._placeholder(f"{owner.pickled_name}.{name}")

    def persistent_load(self, pid: Any) -> _StorageRecord:
        """Resolve torch's ``('storage', dtype, key, location, numel)`` ids from the zip's data records."""
        if self._records is None:
            raise pickle.UnpicklingError("persistent id in a bare pickle (tensor data lives outside this file)")
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r:.80}")
        _, dtype, key, _location, numel = pid
        if not isinstance(dtype, torch.dtype) or not isinstance(key, str) or not isinstance(numel, int):
            raise pickle.UnpicklingError(f"malformed storage id {pid!r:.80}")
        if key not in self._storages:
            data = self._records(f"data/{key}")
            expected = numel * torch.empty(0, dtype=dtype).element_size()
            if len(data) < expected:
                raise pickle.UnpicklingError(f"storage record data/{key} has {len(data)} bytes, expected {expected}")
            self._storages.update({key: _StorageRecord(data[:expected], dtype)})
        return self._storages[key]


def _zip_records(archive: zipfile.ZipFile, prefix: str, source: str) -> Callable[[str], bytes]:
    def read(name: str) -> bytes:
        try:
            return archive.read(prefix + name)
        except KeyError:
            raise pickle.UnpicklingError(f"missing record {name}") from None
    return read


def _check_record_sizes(archive: zipfile.ZipFile, source: str, disk_size: int) -> None:
    """Refuse records whose claimed sizes the file cannot hold, before any of them is read into memory
    (an edited directory entry must not make us allocate gigabytes for a small file)."""
    for info in archive.infolist():
        stored = info.compress_type == zipfile.ZIP_STORED
        if info.compress_size > disk_size or (stored and info.file_size != info.compress_size) \
                or info.file_size > max(info.compress_size, 1) * 1100:  # deflate expands at most ~1032:1
            raise CheckpointError(f"{source}: record {info.filename} claims {info.file_size} bytes, which this "
                                  f"{disk_size}-byte file cannot hold (a truncated or edited archive)")


def read_torch_file(path: str | Path) -> Any:
    """Unpickle a ``torch.save`` file (zip or bare pickle) with :class:`RestrictedUnpickler`.

    Raises :class:`UnsafeCheckpointError` for a pickle that names an unknown callable and
    :class:`CheckpointError` for a file that is not a readable pickle.
    """
    path = Path(path)
    source = str(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                _check_record_sizes(archive, source, path.stat().st_size)
                names = archive.namelist()
                if any(n.endswith("/constants.pkl") and n.count("/") == 1 for n in names):
                    # Its data.pkl names compiled classes (__torch__.*): say what the file is, not "unsafe".
                    raise CheckpointError(f"{source}: not a torch.save checkpoint (TorchScript archive: load it "
                                          "with torch.jit.load; weights need a checkpoint or state dict)")
                pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
                if not pickles:
                    raise CheckpointError(f"{source}: not a torch.save checkpoint (zip file without data.pkl)")
                prefix = pickles[0][: -len("data.pkl")]
                order = archive.read(prefix + "byteorder") if prefix + "byteorder" in names else b"little"
                if order != b"little":
                    raise CheckpointError(f"{source}: big-endian checkpoints are not supported")
                data = archive.read(pickles[0])
                unpickler = RestrictedUnpickler(io.BytesIO(data), source, _zip_records(archive, prefix, source))
                return unpickler.load()
        with path.open("rb") as handle:
            result = RestrictedUnpickler(handle, source).load()
        if isinstance(result, int) and result == LEGACY_TORCH_MAGIC:
            raise CheckpointError(f"{source}: saved in the pre-1.6 torch format; re-save it with torch.save "
                                  "from torch 1.6 or later")
        return result
    except (UnsafeCheckpointError, CheckpointError):
        raise
    except FileNotFoundError:
        raise CheckpointError(f"{source}: no such file") from None
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, ValueError, TypeError, AttributeError,
            IndexError, KeyError) as exc:
        raise CheckpointError(f"{source}: not a readable PyTorch checkpoint ({type(exc).__name__}: {exc})") from None
