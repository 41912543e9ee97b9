"""Dataset sources: turn a folder in YOLO layout or a dataset YAML into lists of image files.

A *source* answers one question: which image files belong to the train and val splits, and what
are the class names. Label files are found beside the images by the YOLO rule (last ``/images/``
path component replaced by ``/labels/``, extension ``.txt``).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .. import yamlio
from ..messages import brief, shown_path
from ..names import DuplicateClassNamesWarning, class_names, describe_repeats, repeated_names
from .walk import SHOWN_REPEATS, FolderWalkWarning, unique_files, walk_folders

IMG_FORMATS = frozenset({"bmp", "jpeg", "jpg", "png", "tif", "tiff", "webp"})

# Split folder names tried, in order, when the root is a plain folder rather than a YAML file.
_TRAIN_NAMES = ("train", "train2017")
_VAL_NAMES = ("val", "valid", "val2017")


@dataclass(frozen=True)
class KeypointLayout:
    """The keypoints of a pose dataset, from its YAML: ``count`` keypoints of ``dims`` values each (``kpt_shape:
    [K, D]``: x, y, or x, y, visibility) and ``flip_idx``, the keypoint each one becomes in a mirrored image (left
    and right swapped; None when the YAML has none)."""

    count: int
    dims: int
    flip_idx: tuple[int, ...] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """``(K, D)``, the YAML's ``kpt_shape``."""
        return self.count, self.dims


@dataclass
class DatasetSource:
    """Resolved dataset: image files of each split and the class names (empty when unknown); ``keypoints`` and
    ``config`` (the dataset YAML, None for a folder without one) for pose datasets."""

    train: list[Path]
    val: list[Path]
    names: list[str] = field(default_factory=list)
    root: Path | None = None
    keypoints: KeypointLayout | None = None
    config: Path | None = None

    def keypoint_layout(self) -> KeypointLayout:
        """The dataset's keypoints, which a pose dataset must declare.

        Raises:
            ValueError: the dataset YAML has no ``kpt_shape``.
        """
        if self.keypoints is None:
            where = self.config or self.root or "dataset"
            raise ValueError(f"{where}: a pose dataset needs 'kpt_shape: [K, D]' (K keypoints of D = 2 values x y or "
                             "3 values x y visibility) and 'flip_idx' in its YAML")
        return self.keypoints


def img2label_path(image: str | os.PathLike) -> Path:
    """Return the label file of ``image``: the last ``/images/`` becomes ``/labels/``, suffix ``.txt``."""
    s = os.fspath(image)
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    if sa in s:
        head, tail = s.rsplit(sa, 1)
        s = head + sb + tail
    return Path(s).with_suffix(".txt")


def label_path_text(image: Path) -> str:
    """``str(img2label_path(image))`` for a Path ``image`` without building Paths (many times faster, for
    loops over every image of a split)."""
    s = str(image)
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    if sa in s:
        head, tail = s.rsplit(sa, 1)
        s = head + sb + tail
    folder, name = os.path.split(s)
    dot = name.rfind(".")
    if not name or name == ".":
        return str(img2label_path(image))  # Path's own error for a path without a file name
    if 0 < dot < len(name) - 1:  # Path's suffix: a dot inside the name, not first or last
        name = name[:dot]
    return os.path.join(folder, name + ".txt")


def list_images(spec: str | os.PathLike | list, base: Path | None = None) -> list[Path]:
    """List image files named by ``spec``: a folder (searched recursively, following links to folders),
    a ``.txt`` list of image paths, a single image, or a list of any of these. Relative paths are resolved
    against ``base``. Each image is listed once: a link loop is not followed and a second path to an
    image already listed is left out, both named in one :class:`~yolotrain.data.walk.FolderWalkWarning`
    (:func:`~yolotrain.data.walk.walk_folders`), as are lines of a list that do not name an image.

    Raises:
        FileNotFoundError: a named folder or file does not exist, or no image is found.
    """
    specs = spec if isinstance(spec, (list, tuple)) else [spec]
    folders: list[Path] = []
    listed: list[Path] = []
    for s in specs:
        p = Path(s).expanduser()
        if base is not None and not p.is_absolute():
            p = base / p
        if p.is_dir():
            folders.append(p)
        elif p.is_file() and p.suffix.lower() == ".txt":
            listed += _list_file_images(p)
        elif p.is_file() and p.suffix[1:].lower() in IMG_FORMATS:
            listed.append(p)
        else:
            raise FileNotFoundError(f"dataset path does not exist: {shown_path(p)}")
    walk = walk_folders(folders, IMG_FORMATS)
    files = _sorted_unique([*listed, *(f for found in walk.files for f in found)])
    if listed:  # a folder walk lists each file once already; lists and single files may name it again
        files, repeated = unique_files(files)
        walk.repeated_files += repeated
    repeats = walk.repeats(", ".join(map(str, specs)), base)
    if repeats:
        warnings.warn(repeats, FolderWalkWarning, stacklevel=2)
    if not files:
        kinds = ", ".join(sorted(IMG_FORMATS))
        raise FileNotFoundError(f"no images ({kinds}) found in {', '.join(map(shown_path, specs))}")
    return files


def _sorted_unique(paths: list[Path]) -> list[Path]:
    """``paths`` normalised, each once, in Path order. Sorted and compared as strings (a Path's comparison and
    hash are many times slower), with a key that orders them as Paths order them; a Path is built only where
    normalising changed one."""
    if os.sep != "/":  # Windows paths compare case-insensitively, drive first: leave the ordering to Path
        return sorted({Path(os.path.normpath(p)) for p in paths})
    unique: dict[str, Path] = {}
    for path in paths:
        text = os.fspath(path)
        normal = os.path.normpath(text)
        unique.setdefault(normal, path if normal == text and isinstance(path, Path) else Path(normal))
    return [unique[text] for text in sorted(unique, key=_posix_path_order)]


def _posix_path_order(path: str) -> list[str]:
    """The parts a POSIX Path compares by (its root, ``/`` or ``//``, first) for a normalised path string."""
    rest = path.lstrip("/")
    slashes = len(path) - len(rest)
    root = [] if not slashes else ["//" if slashes == 2 else "/"]
    return root + (rest.split("/") if rest else [])


def _list_file_images(path: Path) -> list[Path]:
    """The images a ``.txt`` list names, one path a line, relative paths from the list's folder (as the
    reference's tools write them: ``./images/..``); lines naming anything else (a folder, another list, the
    list itself) are left out, named in one :class:`~yolotrain.data.walk.FolderWalkWarning`: a list names
    images, it does not include."""
    images: list[Path] = []
    others: list[str] = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            q = Path(line)
            q = q if q.is_absolute() else path.parent / q
            if q.suffix[1:].lower() in IMG_FORMATS:
                images.append(q)
            else:
                same = q.exists() and os.path.samefile(q, path)
                others.append(f"{line} (this list itself)" if same else line)
    if others:
        shown = ", ".join(others[:SHOWN_REPEATS]) + (
            f" (+{len(others) - SHOWN_REPEATS} more)" if len(others) > SHOWN_REPEATS else "")
        warnings.warn(f"{path}: {len(others)} line(s) not naming an image ({', '.join(sorted(IMG_FORMATS))}) "
                      f"left out: {shown}", FolderWalkWarning, stacklevel=3)
    return images


def _dataset_names(cfg: dict, path: Path) -> list[str]:
    """The ``names`` of a dataset YAML (checked against its ``nc`` when it has one); none when absent."""
    names, nc = cfg.get("names"), cfg.get("nc")
    if names is None:
        return []
    try:
        listed = class_names(names, int(nc) if isinstance(nc, (int, float)) and not isinstance(nc, bool) else None)
    except ValueError as error:
        raise ValueError(f"{path}: {error}" + (f" (nc: {brief(nc)})" if nc is not None else "")) from None
    # A warning, not an error: labels are class ids, so training and scoring by id stay right, and
    # datasets exported with placeholder names still train. What needs unique names refuses them
    # itself (val --map-classes matches classes by name).
    repeats = repeated_names(listed)
    if repeats:
        warnings.warn(f"{path}: {describe_repeats(repeats)}; results by name will not tell them apart",
                      DuplicateClassNamesWarning, stacklevel=4)
    return listed


def _keypoint_layout(cfg: dict, path: Path) -> KeypointLayout | None:
    """The ``kpt_shape`` and ``flip_idx`` of a dataset YAML, checked; None when it has no ``kpt_shape``."""
    shape, flip = cfg.get("kpt_shape"), cfg.get("flip_idx")
    if shape is None:
        if flip is not None:
            raise ValueError(f"{path}: 'flip_idx' without 'kpt_shape: [K, D]'")
        return None
    if (not isinstance(shape, list) or len(shape) != 2 or not all(type(v) is int for v in shape)
            or shape[0] < 1 or shape[1] not in (2, 3)):
        raise ValueError(f"{path}: 'kpt_shape' must be [K, D] with K >= 1 keypoints of D = 2 (x y) or 3 (x y "
                         f"visibility) values, got {brief(shape)}")
    count, dims = shape
    if flip is None:
        return KeypointLayout(count, dims)
    if not isinstance(flip, list) or not all(type(v) is int for v in flip):
        raise ValueError(f"{path}: 'flip_idx' must be a list of keypoint indices, got {brief(flip)}")
    if len(flip) != count:
        raise ValueError(f"{path}: 'flip_idx' has {len(flip)} entries, 'kpt_shape' {count} keypoints")
    if sorted(flip) != list(range(count)):
        raise ValueError(f"{path}: 'flip_idx' must name each keypoint 0..{count - 1} once, got {brief(flip)}")
    return KeypointLayout(count, dims, tuple(flip))


def read_yaml(path: Path) -> object:
    """The contents of a YAML file; a syntax error, a duplicate key or an alias bomb is one line naming
    the file and the line (:mod:`yolotrain.yamlio`)."""
    return yamlio.read_yaml(path)


def _paths_entry(cfg: dict, key: str, path: Path) -> str | list[str]:
    value = cfg[key]
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        return value
    raise ValueError(f"{path}: '{key}' must be a path or a list of paths, got {brief(value)}")


def _from_yaml(path: Path) -> DatasetSource:
    cfg = read_yaml(path) or {}
    if not isinstance(cfg, dict) or "train" not in cfg:
        raise ValueError(f"{path}: dataset YAML needs at least a 'train' entry")
    if cfg.get("path") is not None and not isinstance(cfg["path"], str):
        raise ValueError(f"{path}: 'path' must be a folder, got {brief(cfg['path'])}")
    root = Path(cfg.get("path") or ".").expanduser()
    if not root.is_absolute():
        root = path.parent / root
    if not root.exists():
        raise FileNotFoundError(f"{path}: dataset root does not exist: {shown_path(root)}")
    train = list_images(_paths_entry(cfg, "train", path), root)
    if cfg.get("val"):
        val = list_images(_paths_entry(cfg, "val", path), root)
    else:
        warnings.warn(f"{path}: no 'val' split, validating on the training images", stacklevel=3)
        val = train
    return DatasetSource(train=train, val=val, names=_dataset_names(cfg, path), root=root,
                         keypoints=_keypoint_layout(cfg, path), config=path)


def _from_folder(root: Path) -> DatasetSource:
    images = root / "images"
    if not images.is_dir():
        raise FileNotFoundError(f"dataset folder has no images/ subfolder: {shown_path(images)}")
    train_dir = next((images / n for n in _TRAIN_NAMES if (images / n).is_dir()), None)
    if train_dir is None:
        raise FileNotFoundError(f"no training split ({' or '.join(_TRAIN_NAMES)}) in {shown_path(images)}")
    train = list_images(train_dir)
    val_dir = next((images / n for n in _VAL_NAMES if (images / n).is_dir()), None)
    if val_dir is None:
        warnings.warn(f"{root}: no validation split in {images}, validating on the training images",
                      stacklevel=3)
        val = train
    else:
        val = list_images(val_dir)
    names: list[str] = []
    keypoints = config = None
    for cfg in (root / "data.yaml", root / "dataset.yaml"):
        if cfg.is_file():
            contents = read_yaml(cfg) or {}
            contents = contents if isinstance(contents, dict) else {}
            names, keypoints, config = _dataset_names(contents, cfg), _keypoint_layout(contents, cfg), cfg
            break
    return DatasetSource(train=train, val=val, names=names, root=root, keypoints=keypoints, config=config)


def resolve_source(db_root_dir: str | os.PathLike) -> DatasetSource:
    """Resolve a dataset folder (``images/{train,val}`` or ``images/{train2017,val2017}``) or a
    dataset YAML (``path``, ``train``, ``val``, ``names``) into image lists.

    Raises:
        FileNotFoundError: the path, a split folder or every image is missing.
    """
    p = Path(db_root_dir).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"dataset not found: {shown_path(p)}")
    if p.is_file() and p.suffix.lower() in (".yaml", ".yml"):
        return _from_yaml(p)
    if p.is_dir():
        return _from_folder(p)
    raise ValueError(f"dataset must be a folder or a .yaml file: {shown_path(p)}")


def link_subset(data: str | os.PathLike, root: str | os.PathLike, n: int, split: str = "train") -> Path:
    """A dataset of the first ``n`` images (sorted by name) of a split of ``data``, as symbolic links with
    their labels under ``root``, used as both train and val; returns its YAML.

    Quick experiments and benchmarks on part of a dataset, without any tool writing caches into the
    original folder.
    """
    source = resolve_source(data)
    root = Path(root)
    for kind in ("images", "labels"):
        (root / kind / "val").mkdir(parents=True, exist_ok=True)
    for image in sorted(getattr(source, split), key=lambda p: p.name)[:n]:
        (root / "images" / "val" / image.name).symlink_to(image.resolve())
        label = img2label_path(image)
        if label.exists():
            (root / "labels" / "val" / label.name).symlink_to(label.resolve())
    config = {"path": str(root.resolve()), "train": "images/val", "val": "images/val", "names": source.names}
    (root / "data.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root / "data.yaml"
