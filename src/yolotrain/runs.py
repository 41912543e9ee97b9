"""Run folders: ``runs/train/exp``, then ``exp2``, ``exp3`` ..."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from .messages import brief

# The longest file name Linux, macOS and Windows file systems accept (bytes); a run name leaves room
# for the number added when the name is taken.
FILE_NAME_MAX_BYTES = 255
MAX_NAME_BYTES = 200


def run_dir(project: str | os.PathLike, name: str) -> Path:
    """``project/name``, once both are checked: every command's run folder is made through here.

    Raises:
        ValueError: ``name`` is not one plain folder name (empty, ``.``, ``..``, or holding a path
            separator: the folder would not be ``project``'s child), or a folder name longer than file
            systems allow (checked before any file is touched).
    """
    separators = {"/", os.sep, os.altsep or "/"}
    if name in ("", ".", "..") or separators & set(name) or "\0" in name:
        raise ValueError(f"--name {brief(name)}: a run folder name is one folder name inside --project, "
                         "without path separators, not '.' or '..'")
    for option, value in (("--project", os.fspath(project)), ("--name", name)):
        longest = max(Path(value).parts, key=lambda part: len(part.encode()), default="")
        limit = MAX_NAME_BYTES if option == "--name" else FILE_NAME_MAX_BYTES
        if len(longest.encode()) > limit:
            raise ValueError(f"{option}: the folder name {brief(longest)} is {len(longest.encode())} "
                             f"bytes long, more than the {limit} allowed")
    return Path(project) / name


def next_run_dir(project: str | os.PathLike, name: str = "exp", exist_ok: bool = False) -> Path:
    """``project/name``, or the first free ``project/nameN`` (N = 2, 3 ...) unless ``exist_ok``.

    The folder is not created here.

    Raises:
        ValueError: as :func:`run_dir`.
    """
    base = run_dir(project, name)
    if exist_ok or not base.exists():
        return base
    n = 2
    while (candidate := base.with_name(f"{name}{n}")).exists():
        n += 1
    return candidate


def add_run_dir_arguments(parser: argparse.ArgumentParser, project: str) -> None:
    """``--project``, ``--name`` and ``--exist-ok``: where a command writes its run folder."""
    parser.add_argument("--project", default=project, help=f"parent of the run folder (default {project})")
    parser.add_argument("--name", default="exp", help="run folder name (exp, exp2 ... when taken)")
    parser.add_argument("--exist-ok", action="store_true", help="reuse an existing run folder")


# The lock file in a run folder while a process writes into it.
LOCK_NAME = ".lock"
# Run folders this process holds: POSIX locks do not conflict within one process, so this does.
_HELD: set[Path] = set()


class RunInUseError(RuntimeError):
    """Another process (or another run in this one) is writing into the run folder."""


class RunLock:
    """An exclusive lock on a run folder while this process writes into it: ``with RunLock(folder): ...``.

    The lock is a POSIX record lock (``fcntl.lockf``) on ``folder/.lock``, which holds the owner's process
    id: the kernel releases it when that process ends however it ends, so a lock file left by a dead
    process is simply taken over; DataLoader workers forked by the owner do not inherit it. The file is
    removed on release.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        import fcntl

        key = self.folder.resolve()
        if key in _HELD:
            raise RunInUseError(f"{self.folder} is already being written by this process ({os.getpid()})")
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise RunInUseError(self._busy_message()) from None
            try:  # a holder may have removed the file between our open and lock: lock the file now there
                same_file = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same_file = False
            if same_file:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        _HELD.add(key)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is None:
            return
        _HELD.discard(self.folder.resolve())
        self.path.unlink(missing_ok=True)  # while still locked, so no one locks a file about to vanish
        os.close(self._fd)  # releases the lock
        self._fd = None

    def _busy_message(self) -> str:
        try:
            pid = int(self.path.read_text().strip())
        except (OSError, ValueError):
            return f"{self.folder} is being written by another process (lock file {self.path})"
        alive = process_alive(pid)
        return (f"{self.folder} is being written by process {pid}" + ("" if alive else " (no longer running; "
                "a process it started still holds the lock)") + f": wait for it to end or stop it (lock file "
                f"{self.path})")


def run_lock(folder: str | os.PathLike | None) -> contextlib.AbstractContextManager:
    """What ``predict``, ``val`` and ``track`` hold while they write into their run folder ``folder``: its
    :class:`RunLock`, or nothing when there is no folder or this process holds its lock already (a
    training run validating into its own folder)."""
    if folder is None or Path(folder).resolve() in _HELD:
        return contextlib.nullcontext()
    return RunLock(folder)


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True
