"""Official YOLOv5 weights by name: ``yolov5s.pt`` is found on disk, or downloaded once, verified and kept.

A bare official file name (``yolov5n.pt`` … ``yolov5x.pt``, ``yolov5n6.pt`` … ``yolov5x6.pt``) that is
not a file in the working folder is looked up in the weights folder (``$YOLOTRAIN_WEIGHTS``, default
``<cache>/weights``, see :func:`yolotrain.data.cachedir.cache_root`). When it is not there either, the release asset is
downloaded with a progress bar, its SHA-256 is checked against :data:`SHA256`, and only a verified
file is moved into the folder (atomically: an interrupted download never leaves a partial file
under the real name). An asset without a known hash is never downloaded, since it could not be
verified. Any failure is one line naming the URL and the folder to put the file in.

Official Ultralytics names (``yolov8n.pt``, ``yolo11n-seg.pt``, ``yolov5nu.pt`` ...: :data:`ULTRALYTICS_WEIGHTS`) are
found the same way on disk but never downloaded: Ultralytics publishes no SHA-256 of its release assets (and has
re-released files under the same names), so a missing one is one line naming its release URL and the folder.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from ...atomic import write_atomic
from ...data.cachedir import cache_root

# The ultralytics/yolov5 v7.0 release; ``$YOLOTRAIN_WEIGHTS_URL`` replaces it (a mirror, a local server).
RELEASE_URL = "https://github.com/ultralytics/yolov5/releases/download/v7.0"
# Official checkpoints this package can build: P5 (three levels) and P6 (four levels) detectors and the
# P5 segmentation models, which interop/loading/official.py loads alike.
OFFICIAL_WEIGHTS = ("yolov5n.pt", "yolov5s.pt", "yolov5m.pt", "yolov5l.pt", "yolov5x.pt",
                    "yolov5n6.pt", "yolov5s6.pt", "yolov5m6.pt", "yolov5l6.pt", "yolov5x6.pt",
                    "yolov5n-seg.pt", "yolov5s-seg.pt", "yolov5m-seg.pt", "yolov5l-seg.pt", "yolov5x-seg.pt")
# The Ultralytics assets release its own code downloads YOLOv8/YOLO11/YOLOv5u weights from (named in messages only).
ULTRALYTICS_RELEASE_URL = "https://github.com/ultralytics/assets/releases/download/v8.3.0"
# Official Ultralytics checkpoints of the families and tasks interop/loading/ultralytics.py reads: YOLOv8 and YOLO11
# detection, segmentation, classification and pose, and the anchor-free YOLOv5u detectors.
ULTRALYTICS_WEIGHTS = (tuple(f"{family}{size}{suffix}.pt" for family in ("yolov8", "yolo11")
                             for suffix in ("", "-seg", "-cls", "-pose") for size in "nsmlx")
                       + tuple(f"yolov5{size}u.pt" for size in "nsmlx"))
# SHA-256 of the v7.0 release assets. Names missing from this table (the segmentation models: no hash
# of them could be checked against a copy) are not downloaded: a file that cannot be verified is not
# used. yolov5n.pt was hashed here from a copy of the file. The others come
# from the weights catalogue of github.com/Pitohui-Dichrous/SentinelVision-Workspace (pretrained_weights.py
# at commit dc47c904), which lists each v7.0 asset with its size and hash; it was accepted because it
# gives yolov5n.pt exactly the hash and size (4,062,133 bytes) of our own copy, and the yolov5s.pt and
# yolov5m.pt entries (with their sizes) match those published independently by other projects.
SHA256 = {
    "yolov5n.pt": "4f180cf23ba0717ada0badd6c685026d73d48f184d00fc159c2641284b2ac0a3",
    "yolov5s.pt": "8b3b748c1e592ddd8868022e8732fde20025197328490623cc16c6f24d0782ee",
    "yolov5m.pt": "61d933360ba5a7733a36764996c800287d973889d875227f5beedd2473a97a56",
    "yolov5l.pt": "2f603b7354c25454d1270663a14d8ddc1eea98e5eebc1d84ce0c6e3150fa155f",
    "yolov5x.pt": "9f27a794fa0308e2606f90565164571d6f0a0ba18a3ce2e5e5d323b71c157859",
    "yolov5n6.pt": "496c05a2b991da15acc6c4408c63da287f2513a46c6756618776d4dd71170781",
    "yolov5s6.pt": "95bda9019ada63f37338308d0c81a66047a6fbaba061abaff271ba9334cf2a6f",
    "yolov5m6.pt": "7afe7fa0f29a8351467200a2a5a33c7996d1155ed6636c7edd8ca70b14951c64",
    "yolov5l6.pt": "b357b77f646b0190912985937c44e2923441369d5fda69ba86da2aa919212618",
    "yolov5x6.pt": "257c991b216d625427dc4d9c7c76d6c6d93cf3732797538da34bdc02f97bfef0",
}
_CHUNK = 1 << 20
_TIMEOUT_S = 30


class WeightsUnavailableError(FileNotFoundError):
    """Official weights are neither on disk nor obtainable; the message names the URL and the folder."""


def weights_dir() -> Path:
    """``$YOLOTRAIN_WEIGHTS`` if set, else ``weights`` under the user cache folder (not created here)."""
    env = os.environ.get("YOLOTRAIN_WEIGHTS")
    return Path(env).expanduser() if env else cache_root() / "weights"


def release_url(name: str) -> str:
    """Where the release asset ``name`` is downloaded from (an Ultralytics one: where to download it by hand)."""
    if name in ULTRALYTICS_WEIGHTS:
        return f"{ULTRALYTICS_RELEASE_URL}/{name}"
    base = os.environ.get("YOLOTRAIN_WEIGHTS_URL") or RELEASE_URL
    return f"{base.rstrip('/')}/{name}"


def is_official_name(spec: str | os.PathLike) -> bool:
    """Whether ``spec`` is a bare official weights file name such as ``yolov5s.pt`` or ``yolov8n.pt`` (no folder
    part)."""
    text = os.fspath(spec)
    return Path(text).name == text and (text in OFFICIAL_WEIGHTS or text in ULTRALYTICS_WEIGHTS)


def resolve_weights(spec: str | os.PathLike) -> Path:
    """The file ``spec`` names: the path itself when it exists; for an official name, the copy in
    :func:`weights_dir`, downloaded there first when missing. Other specs are returned unchanged.

    Raises:
        WeightsUnavailableError: an official file that is not on disk and cannot be downloaded and
            verified (offline, HTTP error, incomplete transfer, hash mismatch, no known hash).
    """
    path = Path(spec)
    if path.exists() or not is_official_name(spec):
        return path
    stored = weights_dir() / path.name
    if stored.is_file():
        return stored
    return download_weights(path.name, stored)


def download_weights(name: str, target: Path) -> Path:
    """Download the release asset ``name`` to ``target``, verified against :data:`SHA256`."""
    url = release_url(name)
    put_it = f"download {url} yourself and put it in {target.parent}"
    if name in ULTRALYTICS_WEIGHTS:
        raise WeightsUnavailableError(f"{name}: not in the working folder nor in {target.parent}; Ultralytics "
                                      f"publishes no SHA-256 for its weights, so they are not downloaded: {put_it}")
    expected = SHA256.get(name)
    if expected is None:
        raise WeightsUnavailableError(f"{name}: no verified SHA-256 for it is known to this version of yolotrain, "
                                      f"so it is not downloaded; {put_it}")

    def fetch(temp: Path) -> None:
        digest = hashlib.sha256()
        received = 0
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response, temp.open("wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"Downloading {name}",
                      leave=False) as bar:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
        if total is not None and received != total:
            raise WeightsUnavailableError(f"{name}: download from {url} incomplete ({received} of {total} bytes); "
                                          f"{put_it}")
        actual = digest.hexdigest()
        if actual != expected:
            raise WeightsUnavailableError(f"{name}: SHA-256 mismatch for {url} (got {actual[:16]}…, expected "
                                          f"{expected[:16]}…), file not kept; {put_it}")

    try:
        return write_atomic(target, fetch)
    except WeightsUnavailableError:
        raise
    except urllib.error.HTTPError as error:
        raise WeightsUnavailableError(f"{name}: download failed (HTTP {error.code} {error.reason}) from {url}; "
                                      f"{put_it}") from None
    except urllib.error.URLError as error:
        raise WeightsUnavailableError(f"{name}: cannot reach {url} ({error.reason}; offline?); {put_it}") from None
    except (http.client.HTTPException, OSError) as error:
        raise WeightsUnavailableError(f"{name}: download from {url} failed ({type(error).__name__}: {error}); "
                                      f"{put_it}") from None
