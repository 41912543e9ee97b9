"""``pytest --inplace-doctor``: run every test under :func:`inplace_doctor.watch`.

A test that fails with PyTorch's in-place modification error gets the doctor's report (the
lines that saved and modified the tensor) as an "inplace doctor" section of its failure.
``--inplace-doctor-nan`` runs each test under ``watch(nan=True)`` instead: a test stops at its
first NaN with the NaN-origin report in the same section (it implies ``--inplace-doctor``).
Registered through the ``pytest11`` entry point, so installing the package is enough; torch
is imported only when the option is given.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("inplace-doctor")
    group.addoption(
        "--inplace-doctor",
        action="store_true",
        default=False,
        help="run each test under inplace_doctor.watch() and attach its report to in-place autograd failures",
    )
    group.addoption(
        "--inplace-doctor-nan",
        action="store_true",
        default=False,
        help="as --inplace-doctor, under watch(nan=True): stop a test at its first NaN and attach the "
        "report naming the op that made it",
    )


def _doctor_on(config: pytest.Config) -> bool:
    return bool(config.getoption("inplace_doctor") or config.getoption("inplace_doctor_nan"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    if not _doctor_on(item.config):
        yield
        return
    from .api import watch

    with watch(str(item.config.rootpath), nan=item.config.getoption("inplace_doctor_nan")):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, Any, None]:
    outcome = yield
    if call.excinfo is None or not _doctor_on(item.config):
        return
    reports = getattr(call.excinfo.value, "reports", None)
    if not reports:
        from .view_write import explain_write, write_error_kind

        if write_error_kind(call.excinfo.value) is not None:
            reports = explain_write(call.excinfo.value, call.excinfo.tb, str(item.config.rootpath)).reports
    if reports:
        from .report import format_reports

        outcome.get_result().sections.append(("inplace doctor", format_reports(reports)))
