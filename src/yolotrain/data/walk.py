"""Folder walks that follow symbolic links yet always end: each real folder is listed once (by its
``(st_dev, st_ino)``) and each file once (by the file it names), whatever the links.

A link to a folder already listed, or to a folder holding the walk's own start (``loop -> .``,
``up -> ..``), is not followed; a second path to a file already listed is left out. Both are named in
:meth:`FolderWalk.repeats`, which callers give as one counted :class:`FolderWalkWarning`. Real paths
win over linked ones: folders reached through fewer links are listed first, so a link never takes a
folder or file away from its real place.
"""

from __future__ import annotations

import glob
import heapq
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Repeats named in a warning; the others are counted.
SHOWN_REPEATS = 3
_GLOB_CHARS = frozenset("*?[")

Identity = tuple[int, int]


class FolderWalkWarning(UserWarning):
    """A folder walk left out links to folders it had listed already (loops) or second paths to one file."""


@dataclass
class FolderWalk:
    """What :func:`walk_folders` found: per root, its files (each real file once, sorted by folder then name);
    the folders walked; and what was left out as a repeat."""

    roots: list[Path]
    files: list[list[Path]]
    folders: list[Path] = field(default_factory=list)
    repeated_folders: list[tuple[Path, Path]] = field(default_factory=list)  # (path not followed, listed as)
    repeated_files: list[tuple[Path, Path]] = field(default_factory=list)  # (path left out, listed as)

    def repeats(self, name: str, base: Path | None = None) -> str:
        """One line naming what was left out (empty when nothing was); paths inside ``base`` relative to it."""
        parts = []
        if self.repeated_folders:
            parts.append(f"{len(self.repeated_folders)} folder link(s) not followed, each leading to a folder listed "
                         f"already (a loop or a second path): {_shown(self.repeated_folders, base)}")
        if self.repeated_files:
            parts.append(f"{len(self.repeated_files)} second path(s) to files listed already, counted once: "
                         f"{_shown(self.repeated_files, base)}")
        return f"{name}: {'; '.join(parts)}" if parts else ""


def _shown(pairs: Sequence[tuple[Path, Path]], base: Path | None) -> str:
    def short(path: Path) -> str:
        return str(path.relative_to(base)) if base is not None and path.is_relative_to(base) else str(path)

    shown = ", ".join(f"{short(path)} -> {short(first)}" for path, first in pairs[:SHOWN_REPEATS])
    return shown + (f" (+{len(pairs) - SHOWN_REPEATS} more)" if len(pairs) > SHOWN_REPEATS else "")


def _identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino


def _ancestors(roots: Iterable[Path]) -> dict[Identity, Path]:
    """The folders holding each root (its real path's parents): a link to one of them is a loop."""
    held: dict[Identity, Path] = {}
    for root in roots:
        for parent in Path(os.path.realpath(root)).parents:
            try:
                held.setdefault(_identity(os.stat(parent)), parent)
            except OSError:
                continue
    return held


def walk_folders(roots: Sequence[str | os.PathLike], formats: frozenset[str] | None = None, *,
                 broken_links: bool = False) -> FolderWalk:
    """Every file under each of ``roots`` (recursively, following links to folders), each real folder walked
    once and each file listed once; ``formats``: only files of these suffixes (lower case, no dot).

    ``broken_links``: list links whose target is missing (for a verifier to name them) instead of leaving them
    out. Unreadable folders are passed over, as :func:`os.walk` passes them.
    """
    roots = [Path(r) for r in roots]
    seen: dict[Identity, Path] = {}
    walk = FolderWalk(roots, [[] for _ in roots])
    held = _ancestors(roots)
    # Folders to list, smallest key first: (links followed to reach it, path). Children's keys are never
    # smaller than their parent's, so folders are listed in this order overall, and a folder is claimed by
    # the first of its paths listed: a real path before any through a link.
    queue: list[tuple[int, str, int, Identity]] = []
    for i, root in enumerate(roots):
        try:
            identity = _identity(os.stat(root))
        except OSError:
            continue
        if identity in seen:
            walk.repeated_folders.append((root, seen[identity]))
            continue
        seen[identity] = root
        heapq.heappush(queue, (0, str(root), i, identity))
    candidates: list[tuple[int, str, str, int, Identity | None]] = []  # (links, folder, name, root, identity)
    while queue:
        links, folder, root_index, identity = heapq.heappop(queue)
        first = seen.setdefault(identity, Path(folder))
        if first != Path(folder):  # a second path to it, queued before the first was listed
            walk.repeated_folders.append((Path(folder), first))
            continue
        walk.folders.append(Path(folder))
        try:
            with os.scandir(folder) as entries:
                listed = sorted(entries, key=lambda e: e.name)
            folder_dev = os.stat(folder).st_dev
        except OSError:
            continue
        for entry in listed:
            try:
                is_link, is_dir = entry.is_symlink(), entry.is_dir()
            except OSError:
                continue
            if is_dir:
                try:
                    identity = _identity(entry.stat())
                except OSError:
                    continue
                first = seen.get(identity) or held.get(identity)
                if first is not None:
                    if first != Path(entry.path):  # not a root met again inside another root
                        walk.repeated_folders.append((Path(entry.path), first))
                    continue
                heapq.heappush(queue, (links + is_link, entry.path, root_index, identity))
            elif formats is None or _suffix(entry.name)[1:].lower() in formats:
                if not is_link:
                    if entry.is_file(follow_symlinks=False):
                        candidates.append((links, folder, entry.name, root_index, (folder_dev, entry.inode())))
                    continue
                try:
                    target = entry.stat()
                except OSError:  # a broken link
                    if broken_links:
                        candidates.append((links + 1, folder, entry.name, root_index, None))
                    continue
                if entry.is_file():
                    candidates.append((links + 1, folder, entry.name, root_index, _identity(target)))
    # Paths stay strings until the end: building a Path costs more than the rest of a file's listing.
    listed_files: dict[Identity, str] = {}
    kept: list[tuple[str, str, int]] = []
    for _, folder, name, root_index, identity in sorted(candidates):
        if identity is not None and identity in listed_files:
            walk.repeated_files.append((Path(folder, name), Path(listed_files[identity])))
            continue
        if identity is not None:
            listed_files[identity] = os.path.join(folder, name)
        kept.append((folder, name, root_index))
    for folder, name, root_index in sorted(kept):
        walk.files[root_index].append(Path(os.path.join(folder, name)))
    walk.repeated_files.sort()
    return walk


def _suffix(name: str) -> str:
    """``Path(name).suffix`` of a file name, without building a Path: from the last dot inside the name."""
    dot = name.rfind(".")
    return name[dot:] if 0 < dot < len(name) - 1 else ""


def unique_files(paths: Iterable[Path]) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """``paths`` without second paths to one file (the first kept, in order), and each left out with the path
    kept; a path that cannot be read is kept as it is (its reader names it)."""
    kept: list[Path] = []
    first: dict[Identity, Path] = {}
    repeated: list[tuple[Path, Path]] = []
    for path in paths:
        try:
            identity = _identity(os.stat(path))
        except OSError:
            kept.append(path)
            continue
        if identity in first:
            repeated.append((path, first[identity]))
        else:
            first[identity] = path
            kept.append(path)
    return kept, repeated


def glob_files(pattern: str) -> tuple[list[Path], FolderWalk | None]:
    """The files matching a glob ``pattern``, sorted, as :func:`glob.glob` matches them (``**``: any folders
    below, hidden ones left out), except that a ``**`` walk follows each real folder once
    (:func:`walk_folders`) where :func:`glob.glob` would follow a link loop until paths grow too long. Also
    the walk made for ``**`` (None without one), for its repeats."""
    parts = Path(pattern).parts
    if "**" not in parts:
        return sorted(Path(m) for m in glob.glob(pattern) if os.path.isfile(m)), None
    cut = parts.index("**")
    base, rest = os.path.join(*parts[:cut]) if cut else ".", os.path.join(*parts[cut + 1:]) if parts[cut + 1:] else ""
    bases = ([Path(b) for b in sorted(glob.glob(base)) if os.path.isdir(b)] if _GLOB_CHARS & set(base)
             else [Path(base)])
    walk = walk_folders(bases, formats=frozenset())
    matches: list[Path] = []
    for folder in walk.folders:
        relative = next((folder.relative_to(b) for b in bases if folder.is_relative_to(b)), folder)
        if any(p.startswith(".") for p in relative.parts):
            continue
        found, inner = glob_files(os.path.join(folder, rest or "*"))
        matches += found
        if inner is not None:
            walk.repeated_folders += inner.repeated_folders
    files, repeated = unique_files(sorted(set(matches)))
    walk.repeated_files += repeated
    return files, walk
