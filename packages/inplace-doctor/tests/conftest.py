"""The doctor's tests, run from its own folder too (its pyproject.toml is then pytest's root)."""

import sys


def pytest_sessionfinish(session, exitstatus):
    """torch._dynamo's state is dropped while the interpreter still stands: the cleanup hook of each code
    object dynamo compiled would otherwise fire at shutdown, find dynamo's module torn down and print an
    "Exception ignored" traceback (the repository's conftest.py does the same for runs from its root)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
        dynamo.utils.CleanupManager.instance.clear()
