"""First pass over a split: check every image and label file once, keep the clean labels, and
cache the result beside the labels so later runs skip the pass.

Problems never stop training: a corrupt image is left out, a bad label row is dropped or repaired,
and everything is counted and named (``path:line``) in one summary warning. User files are only read.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import accumulate
from multiprocessing.pool import ThreadPool
from pathlib import Path

import cv2
import numpy as np
from tqdm import tqdm

from ..atomic import write_atomic
from .cachedir import cache_root, file_signature
from .sources import img2label_path, label_path_text

CACHE_VERSION = 6
# Boxes may poke out of the image by this fraction of its size and are clipped; further out they are dropped.
OUT_OF_BOUNDS_TOL = 0.02
MIN_IMAGE_SIDE = 10
NO_POLYGON = np.zeros((0, 2), np.float32)  # the polygon of a box-only label row
KEYPOINT_VISIBILITY = (0, 1, 2)  # COCO's: not labelled, labelled but hidden, visible
DEFAULT_MAX_IMAGE_PIXELS = 100_000_000
# At least this share of out-of-range class ids of all rows means num_classes itself is wrong.
MAX_BAD_CLASS_SHARE = 0.5
# Splits of at least this many images are verified in worker processes (all cores: parsing label text holds the
# GIL); smaller ones in threads of this process. Starting and stopping two forked workers takes about 0.1 s and
# saves about 0.3 ms of wall time per image on two idle cores, so the pool pays from a few hundred images on.
PROCESS_POOL_MIN_IMAGES = 1000
# At most this many images per task sent to a worker process: pickling stays a small share of the work.
PROCESS_CHUNK_IMAGES = 256


class DataWarning(UserWarning):
    """Problems found in dataset files that were skipped or repaired."""


class CacheWarning(DataWarning):
    """A cache file whose content could not have come from the dataset: it is ignored and rebuilt."""


@dataclass
class VerifyReport:
    """Counts and examples of what the verification pass found in one split."""

    total: int = 0
    labelled: int = 0
    backgrounds: int = 0
    corrupt: int = 0
    rows: int = 0
    issues: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def add(self, kind: str, where: str) -> None:
        self.issues[kind].append(where)

    def summary(self, name: str = "", examples: int = 3) -> str:
        """One human-readable paragraph: totals, then each problem kind with a few ``path:line`` examples."""
        head = (f"{name}: " if name else "") + (
            f"{self.total} images, {self.labelled} labelled, {self.backgrounds} backgrounds, "
            f"{self.corrupt} corrupt skipped, {self.rows} boxes"
        )
        lines = [head]
        for kind in sorted(self.issues):
            where = self.issues[kind]
            more = f" (+{len(where) - examples} more)" if len(where) > examples else ""
            lines.append(f"  {len(where)} x {kind}: {'; '.join(where[:examples])}{more}")
        return "\n".join(lines)


@dataclass
class LabelIndex:
    """Verified split: usable image files, their labels ``(n, 5)`` = (class, cx, cy, w, h) normalised,
    and original sizes ``(n, 2)`` as (width, height). ``segments`` holds, per image and label row, the
    row's polygon ``(k, 2)`` (normalised x, y; ``k >= 3``) or ``(0, 2)`` for a box-only row; its box is
    the polygon's bounding box. ``keypoints`` (a pose split, read with its ``kpt_shape``; else None) holds per
    image its rows' keypoints ``(n, K, D)``: normalised x, y (and the visibility, when D is 3)."""

    files: list[Path]
    labels: list[np.ndarray]
    shapes: np.ndarray
    report: VerifyReport
    segments: list[list[np.ndarray]] = field(default_factory=list)
    keypoints: list[np.ndarray] | None = None

    def __post_init__(self) -> None:
        if not self.segments:  # no polygons recorded: every row box-only
            self.segments = [[NO_POLYGON] * len(rows) for rows in self.labels]

    @property
    def has_polygons(self) -> bool:
        """Whether any label row of the split is a polygon (a YOLO-seg dataset)."""
        return any(len(p) for rows in self.segments for p in rows)

    def select(self, order: Sequence[int] | np.ndarray) -> LabelIndex:
        """The images at positions ``order``, in that order, with everything recorded per image."""
        order = [int(i) for i in order]
        return LabelIndex([self.files[i] for i in order], [self.labels[i] for i in order],
                          np.asarray(self.shapes).reshape(-1, 2)[order], self.report,
                          [self.segments[i] for i in order],
                          None if self.keypoints is None else [self.keypoints[i] for i in order])


@dataclass
class _Checked:
    shape: tuple[int, int] | None
    labels: np.ndarray
    issues: list[tuple[str, str]]
    polygons: list[np.ndarray] = field(default_factory=list)
    keypoints: np.ndarray | None = None


def max_image_pixels() -> int:
    """Images larger than this are skipped before decoding (``YOLOTRAIN_MAX_IMAGE_PIXELS``, default 100 MP):
    one 20000x20000 image would take 1.2 GB to decode, and OpenCV refuses anything past 2**30 pixels."""
    return int(os.environ.get("YOLOTRAIN_MAX_IMAGE_PIXELS", DEFAULT_MAX_IMAGE_PIXELS))


def _oversize(path: Path) -> str | None:
    """Why an image is too large to decode, judged from its file header alone; None when it is not."""
    from PIL import Image

    cap = max_image_pixels()
    try:
        with Image.open(path) as im:
            width, height = im.size
    except Image.DecompressionBombError:  # past Pillow's own limit, which is above ours by default
        return f"image has more than {2 * (Image.MAX_IMAGE_PIXELS or 0) / 1e6:.0f} MP"
    except Exception:  # noqa: BLE001 - Pillow signals unreadable headers with many exception types
        return None  # OpenCV's decode below says what is wrong with it
    if width * height > cap:
        return f"image {width}x{height} has more than {cap / 1e6:g} MP (YOLOTRAIN_MAX_IMAGE_PIXELS)"
    return None


def check_image(path: Path) -> tuple[tuple[int, int] | None, str | None]:
    """Decode the whole image (the only reliable test); return ((w, h), None) or (None, reason)."""
    try:
        data = np.fromfile(path, np.uint8)
    except OSError as e:
        return None, f"unreadable ({e.strerror})"
    if data.size == 0:
        return None, "empty file"
    too_large = _oversize(path)
    if too_large:
        return None, too_large
    try:
        im = cv2.imdecode(data, cv2.IMREAD_COLOR)
    except cv2.error:
        return None, "not a decodable image"
    if im is None:
        return None, "not a decodable image"
    # A JPEG cut short still decodes (grey bottom); the end-of-image marker tells. Entropy-coded data
    # never contains FF D9, so finding it near the end is safe even with trailing padding.
    if data[:2].tobytes() == b"\xff\xd8" and b"\xff\xd9" not in data[-64:].tobytes():
        return None, "truncated JPEG (no end marker)"
    h, w = im.shape[:2]
    if min(h, w) < MIN_IMAGE_SIDE:
        return None, f"image {w}x{h} smaller than {MIN_IMAGE_SIDE} px"
    return (w, h), None


def _parse_rows(path: Path, issues: list[tuple[str, str]],
                kpt_shape: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Parse label text into (rows (m, 5), line numbers (m,), polygons); a polygon row becomes its bounding
    box and keeps its points (clipped to the image when they poke out by less than the tolerance); a
    broken polygon (fewer than 3 points, NaN, points far outside the image) is dropped and named.

    With ``kpt_shape`` (K, D) every row is a box and K keypoints of D values: the rows are ``(m, 5 + K * D)``
    and no row is a polygon."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        issues.append(("unreadable label file", f"{path}: {e}"))
        return np.zeros((0, 5)), np.zeros(0, int), []
    if kpt_shape is not None:
        return _parse_pose_rows(path, text, issues, 5 + kpt_shape[0] * kpt_shape[1])
    rows, lines, polygons = [], [], []
    for n, v in _numeric_rows(path, text, issues):
        if v.size == 5:
            rows.append(v)
            polygons.append(NO_POLYGON)
        elif v.size >= 7 and v.size % 2 == 1:  # segment polygon: class, x1, y1, x2, y2, ...
            points = v[1:].reshape(-1, 2)
            if not np.isfinite(points).all():
                issues.append(("polygon with NaN or infinite points", f"{path}:{n}"))
                continue
            if ((points < -OUT_OF_BOUNDS_TOL) | (points > 1 + OUT_OF_BOUNDS_TOL)).any():
                issues.append(("polygon point outside the image", f"{path}:{n}"))
                continue
            points = points.clip(0, 1)
            (x0, y0), (x1, y1) = points.min(0), points.max(0)
            rows.append(np.array([v[0], (x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0]))
            polygons.append(points.astype(np.float32))
        elif v.size == 3:
            issues.append(("polygon with fewer than 3 points", f"{path}:{n}: 1 point"))
            continue
        else:
            issues.append(("wrong column count", f"{path}:{n}: {v.size} columns, expected 5 (a box) or an odd "
                           "number of at least 7 (a polygon)"))
            continue
        lines.append(n)
    if not rows:
        return np.zeros((0, 5)), np.zeros(0, int), []
    return np.stack(rows), np.array(lines), polygons


def _numeric_rows(path: Path, text: str, issues: list[tuple[str, str]]) -> Iterator[tuple[int, np.ndarray]]:
    """Each non-empty line of label ``text`` with its line number, as numbers; a line that is not numbers is named
    in ``issues`` and left out."""
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            yield n, np.array(parts, dtype=np.float64)
        except ValueError:
            issues.append(("non-numeric value", f"{path}:{n}"))


def _parse_pose_rows(path: Path, text: str, issues: list[tuple[str, str]],
                     columns: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Pose label text as :func:`_parse_rows` gives it: rows ``(m, columns)``, their line numbers, box-only polygons."""
    rows, lines = [], []
    for n, v in _numeric_rows(path, text, issues):
        if v.size != columns:
            issues.append(("wrong column count", f"{path}:{n}: {v.size} columns, expected {columns} (class, box "
                           "and the keypoints of kpt_shape)"))
            continue
        rows.append(v)
        lines.append(n)
    if not rows:
        return np.zeros((0, columns)), np.zeros(0, int), []
    return np.stack(rows), np.array(lines), [NO_POLYGON] * len(rows)


def _check_keypoints(path: Path, a: np.ndarray, ln: np.ndarray, keep: np.ndarray, kpt_shape: tuple[int, int],
                     issues: list[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """The keypoints ``(m, K, D)`` of pose rows ``a`` (x, y clipped to the image when they poke out by less than
    the tolerance) and which rows stay kept: rows with a keypoint further out, or a visibility other than 0, 1
    or 2, are dropped and named."""
    count, dims = kpt_shape
    points = a[:, 5:].reshape(len(a), count, dims)
    xy = points[..., :2]
    outside = keep & ((xy < -OUT_OF_BOUNDS_TOL) | (xy > 1 + OUT_OF_BOUNDS_TOL)).any(2).any(1)
    for i in np.flatnonzero(outside):
        k = int(np.flatnonzero(((xy[i] < -OUT_OF_BOUNDS_TOL) | (xy[i] > 1 + OUT_OF_BOUNDS_TOL)).any(1))[0])
        issues.append(("keypoint outside the image", f"{path}:{ln[i]}: keypoint {k} at "
                       f"{xy[i, k, 0]:g} {xy[i, k, 1]:g}"))
    keep = keep & ~outside
    if dims == 3:
        bad = keep & ~np.isin(points[..., 2], KEYPOINT_VISIBILITY).all(1)
        for i in np.flatnonzero(bad):
            k = int(np.flatnonzero(~np.isin(points[i, :, 2], KEYPOINT_VISIBILITY))[0])
            issues.append(("keypoint visibility not 0, 1 or 2", f"{path}:{ln[i]}: keypoint {k} visibility "
                           f"{points[i, k, 2]:g}"))
        keep = keep & ~bad
    points = points.copy()
    points[..., :2] = xy.clip(0, 1)
    return points.astype(np.float32), keep


def _check_labels(path: Path, num_classes: int, issues: list[tuple[str, str]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Validate rows of one label file with vector ops; drop or clip bad rows, recording each. Returns the
    rows and their polygons (``(0, 2)`` for box-only rows)."""
    rows, polygons, _ = _validated_rows(path, num_classes, issues)
    return rows, polygons


def _validated_rows(path: Path, num_classes: int, issues: list[tuple[str, str]],
                    kpt_shape: tuple[int, int] | None = None) -> tuple[np.ndarray, list[np.ndarray], np.ndarray | None]:
    """:func:`_check_labels`, with the rows' keypoints ``(n, K, D)`` read by ``kpt_shape`` (None without it)."""
    a, ln, polygons = _parse_rows(path, issues, kpt_shape)
    no_keypoints = None if kpt_shape is None else np.zeros((0, *kpt_shape), np.float32)
    if not len(a):
        return np.zeros((0, 5), np.float32), [], no_keypoints

    def drop(mask: np.ndarray, kind: str, detail) -> np.ndarray:
        for i in np.flatnonzero(mask):
            issues.append((kind, f"{path}:{ln[i]}{detail(i)}"))
        return ~mask

    cls = a[:, 0]
    keep = drop(~np.isfinite(a).all(1), "non-finite value", lambda i: "")
    bad = keep & ((cls < 0) | (cls != np.round(cls)))
    keep &= drop(bad, "invalid class id", lambda i: f": class id {cls[i]:g}")
    bad = keep & (cls >= num_classes)
    keep &= drop(bad, "class id >= num_classes",
                 lambda i: f": class id {cls[i]:g} >= num_classes {num_classes}")

    xyxy = np.concatenate([a[:, 1:3] - a[:, 3:5] / 2, a[:, 1:3] + a[:, 3:5] / 2], 1)
    outside = ((xyxy < -OUT_OF_BOUNDS_TOL) | (xyxy > 1 + OUT_OF_BOUNDS_TOL)).any(1)
    far = keep & (outside | (a[:, 3:5] <= 0).any(1))
    keep &= drop(far, "box outside the image or not positive",
                 lambda i: f": {' '.join(f'{x:g}' for x in a[i, 1:5])}")
    # Text rounding puts edges a hair past 0 or 1; only clip those silently.
    slightly = keep & ((xyxy < -1e-4) | (xyxy > 1 + 1e-4)).any(1)
    for i in np.flatnonzero(slightly):
        issues.append(("box clipped to the image", f"{path}:{ln[i]}"))
    xyxy = xyxy.clip(0, 1)
    wh = xyxy[:, 2:] - xyxy[:, :2]
    degenerate = keep & (wh <= 1e-6).any(1)
    keep &= drop(degenerate, "degenerate box", lambda i: "")
    keypoints = None
    if kpt_shape is not None:
        keypoints, keep = _check_keypoints(path, a, ln, keep, kpt_shape, issues)
        keypoints = keypoints[keep]

    out = np.concatenate([cls[:, None], (xyxy[:, :2] + xyxy[:, 2:]) / 2, wh], 1)[keep].astype(np.float32)
    ln = ln[keep]
    polygons = [p for p, k in zip(polygons, keep) if k]
    # Two people may share a box: a pose row is a duplicate only when its keypoints are the same too.
    rows = out if kpt_shape is None else np.concatenate([out, keypoints.reshape(len(out), np.prod(kpt_shape))], 1)
    first = _first_of_equal_rows(rows)
    if len(first) < len(out):
        dup = np.ones(len(out), bool)
        dup[first] = False
        for i in np.flatnonzero(dup):
            issues.append(("duplicate row removed", f"{path}:{ln[i]}"))
        out, polygons = out[first], [polygons[i] for i in first]
        keypoints = None if keypoints is None else keypoints[first]
    return out, polygons, keypoints


def _first_of_equal_rows(rows: np.ndarray) -> np.ndarray:
    """Positions of the first of each set of equal rows of finite ``rows``, in order (what ``np.unique(rows,
    axis=0, return_index=True)`` finds, sorted, at a fraction of its cost on a label file's few rows). Adding
    zero turns -0.0 into 0.0, so equal values have equal bytes."""
    first: dict[bytes, int] = {}
    for i, row in enumerate(np.ascontiguousarray(rows + 0.0)):
        first.setdefault(row.tobytes(), i)
    return np.fromiter(first.values(), np.int64, len(first))


def _check_pair(args: tuple[Path, int, tuple[int, int] | None]) -> _Checked:
    image, num_classes, kpt_shape = args
    issues: list[tuple[str, str]] = []
    no_keypoints = None if kpt_shape is None else np.zeros((0, *kpt_shape), np.float32)
    shape, reason = check_image(image)
    if shape is None:
        return _Checked(None, np.zeros((0, 5), np.float32), [("corrupt image skipped", f"{image}: {reason}")],
                        keypoints=no_keypoints)
    label = img2label_path(image)
    if not label.is_file():
        return _Checked(shape, np.zeros((0, 5), np.float32), issues, keypoints=no_keypoints)
    labels, polygons, keypoints = _validated_rows(label, num_classes, issues, kpt_shape)
    return _Checked(shape, labels, issues, polygons, keypoints)


def _fingerprint(files: list[Path], num_classes: int, kpt_shape: tuple[int, int] | None = None) -> str:
    """Hash of the file list with the version of each image and label file (:func:`.cachedir.file_signature`)."""
    h = hashlib.sha256(f"v{CACHE_VERSION} nc={num_classes} kpt_shape={kpt_shape}\n".encode())
    for f in files:
        for p in (str(f), label_path_text(f)):
            try:
                h.update(f"{p}\0{file_signature(p)}\n".encode())
            except OSError:
                h.update(f"{p}\0-\n".encode())
    return h.hexdigest()


def cache_paths(files: list[Path]) -> tuple[Path, Path]:
    """Primary cache file (``labels/<split>.yolotrain.cache``) and the fallback under the user cache
    folder. The name differs from the reference's ``<split>.cache`` (a pickle) so both tools can
    keep their caches side by side instead of overwriting each other's."""
    label_dir = img2label_path(files[0]).parent
    primary = label_dir.with_name(f"{label_dir.name}.yolotrain.cache")
    key = hashlib.sha1(str(label_dir.resolve()).encode()).hexdigest()[:16]
    return primary, cache_root() / "labels" / f"{label_dir.name}-{key}.cache"


def _writable(folder: Path) -> bool:
    """True when ``folder`` may be written. A folder without write bits counts as read-only even for
    root, who could write anyway: shared datasets are marked that way on purpose."""
    try:
        return os.access(folder, os.W_OK) and bool(os.stat(folder).st_mode & 0o222)
    except OSError:
        return False


def _save(path: Path, index: LabelIndex, fingerprint: str, kpt_shape: tuple[int, int] | None = None) -> None:
    r = index.report
    kinds = [k for k in sorted(r.issues) for _ in r.issues[k]]
    wheres = [w for k in sorted(r.issues) for w in r.issues[k]]
    labels = np.concatenate(index.labels) if index.labels else np.zeros((0, 5), np.float32)
    polygons = [p for rows in index.segments for p in rows]
    points = np.concatenate(polygons) if polygons else NO_POLYGON
    columns = 0 if kpt_shape is None else kpt_shape[0] * kpt_shape[1]
    keypoints = np.concatenate([k.reshape(len(k), columns) for k in index.keypoints]) if columns and len(labels) \
        else np.zeros((0, columns), np.float32)

    folder, names = _file_names([str(p) for p in index.files])

    def write(temp: Path) -> None:
        with temp.open("wb") as f:
            np.savez(
                f,
                version=np.array(CACHE_VERSION),
                fingerprint=np.array(fingerprint),
                folder=np.array(folder),
                names=names,
                shapes=index.shapes.astype(np.int32).reshape(-1, 2),
                counts=np.array([len(x) for x in index.labels], dtype=np.int32),
                labels=labels.astype(np.float32).reshape(-1, 5),
                polygon_sizes=np.array([len(p) for p in polygons], dtype=np.int32),
                points=points.astype(np.float32).reshape(-1, 2),
                keypoints=keypoints.astype(np.float32),
                totals=np.array([r.total, r.labelled, r.backgrounds, r.corrupt, r.rows]),
                issue_kinds=np.array(kinds, dtype=str),
                issue_where=np.array(wheres, dtype=str),
            )

    write_atomic(path, write, durable=False)  # a lost cache only costs a re-scan


def _file_names(files: list[str]) -> tuple[str, np.ndarray]:
    """The folder all ``files`` are in (the longest common prefix ending at a separator) and their paths below it,
    UTF-8, NUL-separated, as bytes: a quarter of the size of a numpy string array of whole paths (4 bytes a
    character, padded to the longest), which held most of a large split's cache."""
    common = os.path.commonprefix(files) if files else ""
    folder = common[:common.rfind(os.sep) + 1]
    text = "\0".join(f[len(folder):] for f in files).encode()
    return folder, np.frombuffer(text, np.uint8)


def _read_file_names(folder: np.ndarray, names: np.ndarray) -> list[str]:
    """The paths :func:`_file_names` encoded."""
    if names.dtype != np.uint8 or names.ndim != 1 or folder.ndim != 0:
        raise ValueError("file names are not NUL-separated text")
    text = names.tobytes().decode()
    prefix = str(folder)
    return [prefix + name for name in text.split("\0")] if text else []


def _load(path: Path, fingerprint: str, files: list[Path], num_classes: int,
          kpt_shape: tuple[int, int] | None = None) -> LabelIndex | None:
    """The index cached at ``path`` when it is of these files as they are now, and its content is what a
    scan could have produced; a cache that fails the second check gets a :class:`CacheWarning`."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if int(z["version"]) != CACHE_VERSION or str(z["fingerprint"]) != fingerprint:
                return None
            cached = {k: z[k] for k in ("shapes", "counts", "labels", "totals", "issue_kinds",
                                        "issue_where", "polygon_sizes", "points", "keypoints")}
            names = _read_file_names(z["folder"], z["names"])
    except (OSError, ValueError, KeyError):
        return None
    problem = _untrusted(names, cached, files, num_classes, kpt_shape)
    if problem:
        warnings.warn(f"{path}: cached labels not trusted ({problem}); verifying the split again", CacheWarning,
                      stacklevel=4)
        return None
    counts, labels = cached["counts"], cached["labels"].astype(np.float32)
    report = VerifyReport(*(int(x) for x in cached["totals"]))
    for k, w in zip(cached["issue_kinds"].tolist(), cached["issue_where"].tolist()):
        report.add(str(k), str(w))
    # A box-only row's polygon is the shared empty one, as a scan records it: an empty array per box would cost
    # about 0.1 KB each, and the garbage collector's walks over them.
    points, sizes = cached["points"].astype(np.float32), cached["polygon_sizes"].tolist()
    polygons = [points[end - size:end] if size else NO_POLYGON for size, end in zip(sizes, accumulate(sizes))]
    starts = np.cumsum(counts) - counts
    segments = [polygons[start:start + count] for start, count in zip(starts.tolist(), counts.tolist())]
    keypoints = None
    if kpt_shape is not None:
        keypoints = _pieces(cached["keypoints"].astype(np.float32).reshape(-1, *kpt_shape), counts)
    by_name = {str(f): f for f in files}  # the split's own Paths: building them again costs more than the load
    return LabelIndex([by_name[name] for name in names], _pieces(labels, counts),
                      cached["shapes"].astype(np.int64), report, segments, keypoints)


def _pieces(rows: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """``rows`` cut into consecutive views of ``counts`` rows each (:func:`numpy.split`'s pieces, made faster)."""
    ends = np.cumsum(counts).tolist()
    return [rows[start:end] for start, end in zip([0, *ends[:-1]], ends)]


def _untrusted(names: list[str], cached: dict[str, np.ndarray], files: list[Path], num_classes: int,
               kpt_shape: tuple[int, int] | None = None) -> str | None:
    """Why a label cache's file ``names`` and arrays are not what :func:`_scan` writes for ``files`` (None when
    they are): anyone who can write the cache file can put anything in it, whatever its fingerprint says."""
    shapes, counts, labels, totals, sizes, points = (
        cached[k] for k in ("shapes", "counts", "labels", "totals", "polygon_sizes", "points"))
    n = len(names)
    if shapes.shape != (n, 2) or counts.shape != (n,) or totals.shape != (5,):
        return "array sizes disagree"
    if not all(a.dtype.kind in "iu" for a in (shapes, counts, totals)) or labels.dtype.kind != "f":
        return "wrong array types"
    if (counts < 0).any() or (totals < 0).any() or labels.shape != (int(counts.sum()), 5):
        return "label counts disagree with the labels"
    if (sizes.dtype.kind not in "iu" or points.dtype.kind != "f" or sizes.shape != (len(labels),)
            or (sizes < 0).any() or ((sizes > 0) & (sizes < 3)).any() or points.shape != (int(sizes.sum()), 2)):
        return "polygon sizes disagree with the polygons"
    if not np.isfinite(points).all() or (points < 0).any() or (points > 1).any():
        return "polygon points outside the image"
    keypoints = cached["keypoints"]
    columns = 0 if kpt_shape is None else kpt_shape[0] * kpt_shape[1]
    if keypoints.dtype.kind != "f" or keypoints.shape != (len(labels) if columns else 0, columns):
        return "keypoint counts disagree with the labels"
    if columns:
        keypoints = keypoints.reshape(len(labels), *kpt_shape)
        if (not np.isfinite(keypoints).all() or (keypoints[..., :2] < 0).any() or (keypoints[..., :2] > 1).any()
                or (kpt_shape[1] == 3 and not np.isin(keypoints[..., 2], KEYPOINT_VISIBILITY).all())):
            return "keypoints outside the image or of unknown visibility"
    order = {str(f): i for i, f in enumerate(files)}
    positions = [order.get(name, -1) for name in names]
    if min(positions, default=0) < 0 or any(b <= a for a, b in zip(positions, positions[1:])):
        return "files that are not the split's"
    if len(shapes) and ((shapes < MIN_IMAGE_SIDE).any() or (shapes.prod(1) > max_image_pixels()).any()):
        return "image sizes out of range"
    if not np.isfinite(labels).all():
        return "non-finite label values"
    cls, xy, wh = labels[:, 0], labels[:, 1:3], labels[:, 3:5]
    if ((cls < 0) | (cls >= num_classes) | (cls != np.round(cls))).any():
        return f"class ids outside 0..{num_classes - 1}"
    edge = 1e-4  # float32 rounding of boxes clipped to the image
    if (wh <= 0).any() or (xy - wh / 2 < -edge).any() or (xy + wh / 2 > 1 + edge).any():
        return "boxes outside the image"
    return None


def _raise_if_nc_wrong(report: VerifyReport, num_classes: int) -> None:
    bad = report.issues.get("class id >= num_classes", [])
    if bad and len(bad) >= MAX_BAD_CLASS_SHARE * (report.rows + len(bad)):
        raise ValueError(f"{bad[0]} ({len(bad)} rows have class ids >= num_classes {num_classes}; "
                         "is num_classes right?)")


def verify_split(
    files: list[Path], num_classes: int, name: str = "", workers: int | None = None,
    kpt_shape: tuple[int, int] | None = None,
) -> LabelIndex:
    """Check every image/label pair of a split (cached), warn once with a summary of problems,
    and return the usable images with their labels.

    ``kpt_shape`` (K, D), a pose dataset's: every row is ``class cx cy w h`` and K keypoints of D values (x y,
    or x y visibility), normalised; rows of other lengths, with keypoints outside the image or of a visibility
    other than 0, 1 or 2 are dropped and named like other bad rows; the index then carries the keypoints.

    Raises:
        ValueError: most label rows have class ids ``>= num_classes`` (the setting is wrong), or no
            usable image is left.
    """
    kpt_shape = None if kpt_shape is None else (int(kpt_shape[0]), int(kpt_shape[1]))
    fingerprint = _fingerprint(files, num_classes, kpt_shape)
    primary, fallback = cache_paths(files)
    index = (_load(primary, fingerprint, files, num_classes, kpt_shape)
             or _load(fallback, fingerprint, files, num_classes, kpt_shape))
    if index is None:
        index = _scan(files, num_classes, name, workers, kpt_shape)
        targets = (primary, fallback) if _writable(primary.parent) else (fallback,)
        for target in targets:
            try:
                _save(target, index, fingerprint, kpt_shape)
                break
            except OSError:
                continue  # unwritable: try the user cache folder; failing both only costs time next run
    if index.report.issues:
        warnings.warn(index.report.summary(name), DataWarning, stacklevel=3)
    _raise_if_nc_wrong(index.report, num_classes)
    if not index.files:
        raise ValueError(f"{name or 'dataset'}: no usable images left after verification")
    return index


def _scan(files: list[Path], num_classes: int, name: str, workers: int | None,
          kpt_shape: tuple[int, int] | None = None) -> LabelIndex:
    report = VerifyReport(total=len(files))
    kept, labels, shapes, segments, keypoints = [], [], [], [], []
    with tqdm(total=len(files), desc=f"verifying {name}".strip(), disable=None, leave=False) as progress:
        for f, r in zip(files, _checked_pairs(files, num_classes, workers, kpt_shape, progress)):
            for kind, where in r.issues:
                report.add(kind, where)
            if r.shape is None:
                report.corrupt += 1
                continue
            kept.append(f)
            labels.append(r.labels)
            segments.append(r.polygons)
            keypoints.append(r.keypoints)
            shapes.append(r.shape)
            report.rows += len(r.labels)
            if len(r.labels):
                report.labelled += 1
            else:
                report.backgrounds += 1
    sharing: dict[str, list[Path]] = defaultdict(list)
    for f in kept:
        sharing[label_path_text(f)].append(f)
    for label, images in sharing.items():
        if len(images) > 1 and os.path.isfile(label):
            report.add("images sharing one label file", f"{label} <- {', '.join(p.name for p in images)}")
    if kept and not report.labelled:
        report.add("no boxes in the whole split", f"{len(kept)} images, every one a background")
    return LabelIndex(kept, labels, np.array(shapes, dtype=np.int64).reshape(-1, 2), report, segments,
                      None if kpt_shape is None else keypoints)


def _checked_pairs(files: list[Path], num_classes: int, workers: int | None, kpt_shape: tuple[int, int] | None,
                   progress: tqdm) -> Iterator[_Checked]:
    """:func:`_check_pair` of every image of ``files``, in order: in worker processes for a large split on a
    machine with several cores, else in threads of this process (decoding releases the GIL, and nothing is
    pickled)."""
    cores = os.cpu_count() or 1
    processes = min(workers or cores, cores)
    if len(files) >= PROCESS_POOL_MIN_IMAGES and processes > 1:
        size = max(1, min(PROCESS_CHUNK_IMAGES, -(-len(files) // (4 * processes))))  # a few chunks per worker
        chunks = [files[i:i + size] for i in range(0, len(files), size)]
        # Fork where the platform has it: a spawned worker would first import torch; the workers only run
        # NumPy, OpenCV and Pillow code.
        context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        with ProcessPoolExecutor(min(processes, len(chunks)), mp_context=context) as pool:
            for checked, caught in pool.map(_check_chunk, ((chunk, num_classes, kpt_shape) for chunk in chunks)):
                _reissue(caught)
                progress.update(len(checked))
                yield from checked
        return
    with ThreadPool(workers or min(8, cores)) as pool:
        for checked in pool.imap(_check_pair, [(f, num_classes, kpt_shape) for f in files], chunksize=8):
            progress.update()
            yield checked


def _check_chunk(args: tuple[list[Path], int, tuple[int, int] | None],
                 ) -> tuple[list[_Checked], list[tuple[str, type[Warning]]]]:
    """:func:`_check_pair` of each image of a chunk, in a worker process, with the warnings its libraries issued
    (message and category), which the parent issues again: a worker's own would not reach the user once."""
    images, num_classes, kpt_shape = args
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checked = [_check_pair((image, num_classes, kpt_shape)) for image in images]
    return checked, [(str(w.message), w.category) for w in caught]


def _reissue(caught: Iterable[tuple[str, type[Warning]]]) -> None:
    for message, category in caught:
        warnings.warn(message, category, stacklevel=2)
