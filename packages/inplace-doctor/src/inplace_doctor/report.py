"""The report the doctor prints: which saved tensor, who saved it, who modified it, how to fix it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAIN_THREAD = "MainThread"
# Version of the ``--json`` report: 2 added ``schema`` and ``kind`` and the reports of other failures.
SCHEMA_VERSION = 2
INPLACE = "inplace"


@dataclass(frozen=True)
class Site:
    """One operator call: the aten op name and the user's source line that ran it.

    Modifications also say which thread ran them and whether a backward pass called the code
    (a hook, a custom ``backward``, checkpoint recomputation); ``None`` for the saving site.
    """

    op: str
    file: str
    line: int
    code: str
    thread: str | None = None
    in_backward: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"op", "file", "line", "code"}``, plus ``"thread", "in_backward"`` for modifications."""
        data: dict[str, Any] = {"op": self.op, "file": self.file, "line": self.line, "code": self.code}
        if self.thread is not None:
            data["thread"] = self.thread
            data["in_backward"] = bool(self.in_backward)
        return data

    def where(self) -> str:
        """``path:LINE``, the form editors and terminals make clickable."""
        return f"{self.file}:{self.line}"

    def circumstances(self) -> str:
        """`` (during backward, in thread NAME)`` when the write was not ordinary code on the main thread."""
        parts = []
        if self.in_backward:
            parts.append("during backward")
        if self.thread is not None and self.thread != MAIN_THREAD:
            parts.append(f"in thread {self.thread}")
        return f" ({', '.join(parts)})" if parts else ""


@dataclass(frozen=True)
class TensorInfo:
    """The saved tensor as PyTorch's error message describes it, plus its versions."""

    dtype: str
    shape: list[int]
    device: str
    saved_version: int
    current_version: int
    type_name: str  # legacy name PyTorch prints, e.g. "torch.FloatTensor"

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"dtype", "shape", "device", "saved_version", "current_version"}``."""
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "device": self.device,
            "saved_version": self.saved_version,
            "current_version": self.current_version,
        }

    def describe(self) -> str:
        """Same bracketed form as PyTorch's message, e.g. ``[torch.FloatTensor [2, 3]]``."""
        return f"[{self.type_name} [{', '.join(str(s) for s in self.shape)}]]"


@dataclass
class Report:
    """Diagnosis of one tensor that was modified in place after autograd saved it.

    ``severity`` is ``"error"`` when backward failed on it and ``"warning"`` when it was
    found proactively (see :func:`inplace_doctor.check_step`); ``notes`` carries facts
    that qualify the sites (hidden ``.data`` writes, version bumps not observed).
    """

    error: str
    tensor: TensorInfo
    saved_by: Site
    modified_by: list[Site]
    fix: str
    severity: str = "error"
    notes: list[str] = field(default_factory=list)
    count: int = 1
    observed: bool = True  # every version bump since the save is explained by ``modified_by``
    patches: list[Patch] = field(default_factory=list)  # the fix as edits (changed lines, or hunks)
    verification: Verification | None = None  # set by ``--verify-fix`` once the patches were run
    # Further patches (lines or hunks) that may fix it but are proposed only once a run verified them.
    candidates: list[Patch] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object documented for ``--json``: everything the text form shows."""
        return _with_verification(self.verification, {
            "schema": SCHEMA_VERSION,
            "kind": INPLACE,
            "error": self.error,
            "tensor": self.tensor.to_dict(),
            "saved_by": self.saved_by.to_dict(),
            "modified_by": [site.to_dict() for site in self.modified_by],
            "fix": self.fix,
            "severity": self.severity,
            "observed": self.observed,
            "notes": list(self.notes),
            "count": self.count,
            "patches": [patch.to_dict() for patch in self.patches],
        })

    def format(self) -> str:
        """Human-readable multi-line form with ``path:LINE`` for every site."""
        t = self.tensor
        title = "error" if self.severity == "error" else "warning"
        repeated = f" (seen {self.count} times)" if self.count > 1 else ""
        lines = [
            f"doctor {title}: {self.error}",
            f"  tensor:      {t.describe()} dtype={t.dtype} device={t.device}, "
            f"saved at version {t.saved_version}, now at version {t.current_version}{repeated}",
            f"  saved by:    {self.saved_by.op} at {self.saved_by.where()}",
            f"                   {self.saved_by.code}",
        ]
        if self.modified_by:
            for index, site in enumerate(self.modified_by):
                label = "modified by:" if index == 0 else "            "
                lines.append(f"  {label} {site.op} at {site.where()}{site.circumstances()}")
                lines.append(f"                   {site.code}")
        else:
            lines.append("  modified by: (not observed; see the note)")
        return "\n".join(lines + _closing_lines(self.notes, self.fix, self.patches, self.verification))

    def __str__(self) -> str:
        return self.format()


@dataclass(frozen=True)
class Patch:
    """A proposed fix as an edit of one file.

    Without ``end``, line ``line`` becomes ``code`` (one line; the old line's indentation is kept).
    With ``end``, lines ``line`` to ``end`` become the lines of ``code`` as written, indentation
    included, as in a diff hunk: the form of edits no single line makes (a statement moved after a
    backward call, a copy made before a write, two backward calls made one).
    """

    file: str
    line: int
    code: str
    end: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Patch:
        """The patch of a JSON report's ``patches`` entry (see :meth:`to_dict`)."""
        return cls(data["file"], data["line"], data["code"], data.get("end"))

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"file", "line", "code"}``, plus ``"end"`` for an edit of lines ``line``..``end``."""
        data: dict[str, Any] = {"file": self.file, "line": self.line, "code": self.code}
        if self.end is not None:
            data["end"] = self.end
        return data

    def where(self) -> str:
        """``path:LINE`` or ``path:LINE-END``."""
        lines = f"{self.line}" if self.end is None or self.end == self.line else f"{self.line}-{self.end}"
        return f"{self.file}:{lines}"

    def summary(self) -> str:
        """The edit in a phrase: the code in backquotes and ``at path:LINE``; a hunk's lines joined by `` / ``."""
        code = " / ".join(line.strip() for line in self.code.splitlines() if line.strip())
        return f"`{code}` at {self.where()}"

    def describe(self) -> str:
        """The ``change:`` lines of the text report."""
        code = "\n".join(f"                   {line}".rstrip() for line in self.code.split("\n"))
        return f"  change:      {self.where()} to\n{code}"

    def apply(self, source: str) -> str:
        """``source`` (the file's text) with the edit made."""
        lines = source.splitlines(keepends=True)
        if self.end is None:
            old = lines[self.line - 1]
            indent = old[: len(old) - len(old.lstrip())]
            lines[self.line - 1] = f"{indent}{self.code}\n"
        else:
            lines[self.line - 1 : self.end] = [f"{line}\n" for line in self.code.split("\n")]
        return "".join(lines)


def apply_patches(source: str, patches: Sequence[Patch]) -> str:
    """``source`` with every patch made; each patch's line numbers are those of ``source`` (edits must not overlap)."""
    for patch in sorted(patches, key=lambda patch: patch.line, reverse=True):
        source = patch.apply(source)
    return source


@dataclass
class GraphReport:
    """Diagnosis of an autograd failure other than the in-place one (``kind`` names it).

    ``sites`` are the lines involved, each with its role (``"freed by"``, ``"carried by"``...),
    ``patches`` the fix as line edits that can be applied and run.
    """

    kind: str
    error: str
    sites: list[tuple[str, Site]]
    fix: str
    patches: list[Patch] = field(default_factory=list)
    severity: str = "error"
    notes: list[str] = field(default_factory=list)
    verification: Verification | None = None  # set by ``--verify-fix`` once the patches were run
    # Further patches (lines or hunks) that may fix it but are proposed only once a run verified them.
    candidates: list[Patch] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object documented for ``--json`` (schema 2)."""
        return _with_verification(self.verification, {
            "schema": SCHEMA_VERSION,
            "kind": self.kind,
            "error": self.error,
            "sites": [{"role": role, **site.to_dict()} for role, site in self.sites],
            "fix": self.fix,
            "patches": [patch.to_dict() for patch in self.patches],
            "severity": self.severity,
            "notes": list(self.notes),
        })

    def format(self) -> str:
        """Human-readable multi-line form with ``path:LINE`` for every site."""
        lines = [f"doctor {self.severity}: {self.error}"]
        for role, site in self.sites:
            lines.append(f"  {role + ':':<12} {site.op} at {site.where()}")
            lines.append(f"                   {site.code}")
        return "\n".join(lines + _closing_lines(self.notes, self.fix, self.patches, self.verification))

    def __str__(self) -> str:
        return self.format()


@dataclass(frozen=True)
class Verification:
    """What running a copy of the program with a report's patches applied showed (``--verify-fix``).

    ``verified`` when the patched copy ran to the end under the doctor with exit code 0 and nothing
    reported; ``steps`` counts the backward passes it completed; ``detail`` is the sentence the
    report prints; ``tried`` the patches that were run (a report keeps in ``patches`` only verified ones).
    """

    verified: bool
    detail: str
    steps: int = 0
    tried: tuple[Patch, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"verified", "detail", "steps", "tried"}``."""
        return {"verified": self.verified, "detail": self.detail, "steps": self.steps,
                "tried": [patch.to_dict() for patch in self.tried]}


def _with_verification(verification: Verification | None, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the ``verification`` object, present only when ``--verify-fix`` ran the patches."""
    if verification is not None:
        data["verification"] = verification.to_dict()
    return data


def _closing_lines(notes: Sequence[str], fix: str, patches: Sequence[Patch],
                   verification: Verification | None = None) -> list[str]:
    """The lines every report ends with: its notes, the fix, the fix's changed lines and their verification."""
    return [*(f"  note:        {note}" for note in notes), f"  fix:         {fix}",
            *(patch.describe() for patch in patches),
            *([f"  verify-fix:  {verification.detail}"] if verification is not None else [])]


def reports_to_json(reports: list[Report] | list[GraphReport]) -> str:
    """One JSON object for a single report, a list when several tensors are involved."""
    if len(reports) == 1:
        return json.dumps(reports[0].to_dict(), indent=2)
    return json.dumps([r.to_dict() for r in reports], indent=2)


def format_reports(reports: list[Report] | list[GraphReport]) -> str:
    """Text form of several reports separated by blank lines."""
    return "\n\n".join(r.format() for r in reports)
