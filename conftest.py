"""What every test session run from the repository's root shares (yolotrain's tests and the doctor's). The
only conftest.py beside tests/conftest.py: tests import that one as ``conftest``, so no other test folder has one."""

import sys


def pytest_sessionfinish(session, exitstatus):
    """torch._dynamo's state is dropped while the interpreter still stands (tests compile training and run
    compiled programs under the doctor in this process). Each code object dynamo made holds a cleanup hook
    that fires when the object is collected; at the interpreter's shutdown the hook finds dynamo's module
    already torn down and prints an "Exception ignored" traceback. Dropping the weak references to those
    code objects now means no hook is left to fire."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
        dynamo.utils.CleanupManager.instance.clear()
