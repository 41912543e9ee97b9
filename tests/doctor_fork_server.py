"""Runs ``python -m MODULE ARGS`` or ``python SCRIPT ARGS`` in a process forked from this one, which has
already imported torch and the doctor: the corpus tests run the doctor some two hundred times, and
each fresh interpreter would spend most of its time importing torch again.

Reads one JSON request a line on stdin: ``{"argv": [...], "cwd": ..., "stdout": FILE, "stderr": FILE,
"timeout": SECONDS}``, where ``argv`` is ``["-m", MODULE, ARGS...]`` or ``[SCRIPT, ARGS...]``; the child
runs it in ``cwd`` with its output in the two files; the server answers ``{"returncode": N}`` (``-9``
when the timeout killed the child). Every child starts from this process's state, never a previous
child's. The command line itself (``python -m inplace_doctor``) is run by test_doctor.py and the
package's entry-point tests.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import time
import traceback

import inplace_doctor.cli  # noqa: F401  (what ``python -m inplace_doctor`` imports before the script)
import torch  # noqa: F401


def _child(request: dict) -> int:
    os.chdir(request["cwd"])
    for fd, name in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
        target = os.open(name, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    argv = request["argv"]
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exit_request:  # sys.exit's argument as the interpreter treats it
        code = 0 if exit_request.code is None else exit_request.code
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - the interpreter prints any uncaught error and exits 1
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -signal.SIGKILL
        time.sleep(0.01)


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(request)
            finally:
                os._exit(code)
        print(json.dumps({"returncode": _wait(pid, request["timeout"])}), flush=True)


if __name__ == "__main__":
    main()
