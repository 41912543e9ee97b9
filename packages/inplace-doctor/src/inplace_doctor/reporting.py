"""From matched writes to reports: the findings a tracker keeps, and the reports built from them.

A write matched to a saved tensor is settled once its operator's version bump has happened;
:class:`Findings` keeps those that changed a saved tensor, one finding per save line, operator
and write line however often a loop repeats it. The functions below turn a finding, or a record
whose version check failed, into a :class:`Report`; sites and source text are resolved only then.
"""

from __future__ import annotations

import threading

from .fixes import Change, suggest_fix
from .frames import resolve
from .inplace_patch import propose_patch
from .messages import VERSION_ERROR, SavedTensorModifiedError, pytorch_hint, pytorch_type_name
from .records import BACKWARD_SUFFIX, Finding, Modification, PendingWrite, SavedRecord, observed_bumps
from .report import Report, Site, TensorInfo
from .torch_shim import overlaps


class Findings:
    """The distinct saved tensors found modified in place, up to ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[Finding] = []
        self.dropped = 0  # distinct findings beyond the limit, counted only
        self._by_key: dict[tuple, Finding] = {}
        self._lock = threading.Lock()  # writes of other threads are settled on those threads

    def settle(self, writes: list[PendingWrite]) -> None:
        """Decide, now that version counters were bumped, which matched writes changed a saved tensor."""
        for write in writes:
            rec = write.record
            after = rec.tensor._version
            bumped = after > write.before
            if not bumped and not overlaps(write.written, rec.tensor):
                continue
            with self._lock:
                self._add(rec, Modification(write, not bumped, after))

    def _add(self, rec: SavedRecord, mod: Modification) -> None:
        """Attach ``mod`` to its record and to the (deduplicated) list of findings."""
        if rec.mods is None:
            rec.mods = []
        rec.mods.append(mod)
        finding = rec.finding
        if finding is None:
            key = (rec.info.site, mod.op, mod.context.site, mod.hidden)
            finding = self._by_key.get(key)
            if finding is None:
                if len(self.items) >= self.limit:
                    self.dropped += 1
                    return
                finding = self._by_key[key] = Finding(rec)
                self.items.append(finding)
            else:
                finding.count += 1
            rec.finding = finding
        finding.add(mod)


def version_error(rec: SavedRecord, cwd: str) -> SavedTensorModifiedError:
    """PyTorch's exact error for ``rec``, with a report attached and appended as a note."""
    message = pytorch_message(rec)
    finding = Finding(rec)
    for mod in rec.mods or ():
        finding.add(mod)
    finding.current_version = rec.tensor._version
    report = finding_report(finding, "error", message, cwd)
    error = SavedTensorModifiedError(message, [report])
    if hasattr(error, "add_note"):
        error.add_note("\n" + report.format())
    return error


def pytorch_message(rec: SavedRecord) -> str:
    """Reproduce PyTorch's message, including the ``which is output N of X`` clause."""
    t = rec.tensor
    info = rec.info
    producer: tuple[str, int] | None = info.producer
    if producer is not None:
        pass
    elif info.output_save and info.node_name is not None:
        # A saved output names the node that saved it, which is the failing node itself.
        producer = (info.node_name, info.output_nr)
    else:
        original = t if rec.orig_ref is None else rec.orig_ref()
        grad_fn = original.grad_fn if original is not None else None
        if grad_fn is not None:
            producer = (grad_fn.name(), original.output_nr)  # type: ignore[union-attr]
    clause = ""
    if producer is not None:
        clause = f", which is output {producer[1]} of {BACKWARD_SUFFIX.sub('', producer[0])},"
    shape = ", ".join(str(s) for s in t.shape)
    return (
        f"{VERSION_ERROR}: [{pytorch_type_name(t)} [{shape}]]{clause} is at version {t._version}; "
        f"expected version {rec.version} instead.{pytorch_hint()}"
    )


def finding_report(finding: Finding, severity: str, error: str, cwd: str) -> Report:
    """Turn a finding into a :class:`Report` (resolving sites and source text now)."""
    saved_at = resolve(finding.info.site, cwd)
    saved_by = Site(finding.info.saver(saved_at.code), saved_at.file, saved_at.line, saved_at.code)
    sites: list[Site] = []
    changes: list[Change] = []
    for mod in finding.mods:
        where = resolve(mod.context.site, cwd)
        sites.append(Site(mod.op, where.file, where.line, where.code, mod.thread, mod.in_backward))
        changes.append(Change(mod.op, where.code, mod.context, mod.hidden))
    dtype, shape, device, type_name = finding.meta
    tensor = TensorInfo(dtype, shape, device, finding.saved_version, finding.current_version, type_name)
    notes = []
    if any(mod.hidden for mod in finding.mods):
        notes.append("written without a version bump (through .data or an alias), so PyTorch cannot detect it")
    missing = finding.current_version - finding.saved_version - observed_bumps(finding)
    observed = True
    if missing > 0 and severity == "error":
        observed = False
        notes.append(
            f"{missing} version bump(s) came from code the doctor does not watch: outside doctor.watch(), "
            "a thread started before it, or a hook the autograd engine ran on a device thread"
        )
    fix = suggest_fix(changes)
    patches, candidates, no_patch = propose_patch(saved_by, sites, changes, finding.info.output_save, cwd)
    if no_patch is not None:
        fix = f"{fix}; {no_patch}"
    return Report(error, tensor, saved_by, sites, fix, severity, notes, finding.count, observed, patches,
                  candidates=candidates)


def warning_reports(findings: list[Finding], cwd: str) -> list[Report]:
    """A warning for each finding: a saved tensor modified before backward used it (or never will)."""
    out = []
    for finding in findings:
        hidden = all(mod.hidden for mod in finding.mods)
        op = finding.info.saver(resolve(finding.info.site, cwd).code)
        if hidden:
            text = (
                f"tensor saved for backward by {op} was overwritten without a version bump; "
                "backward will silently use the new values"
            )
        else:
            text = f"tensor saved for backward by {op} was modified in place before backward used it"
        out.append(finding_report(finding, "warning", text, cwd))
    return out
