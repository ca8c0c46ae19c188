"""What every console script does at its edge: a closed pipe and Ctrl-C end it quietly.

`gpualloc solve ... -o yaml | head -1` closes the pipe while the command still writes. Python
ignores SIGPIPE, so the write raises BrokenPipeError, and without care the user sees a
traceback (or "Exception ignored ... BrokenPipeError" when the final flush fails). The standard
handling (the Python docs, "Note on SIGPIPE"): flush inside the handler, and on a broken pipe
point stdout at /dev/null so that the interpreter's last flush has nowhere to fail, then exit
141 — what a shell reports for a command killed by SIGPIPE (128 + 13), so `set -o pipefail`
scripts still see that the output was cut short. Ctrl-C exits 130 (128 + SIGINT), quietly.

Bad input is each command's own business (a message and exit 2); this guard is for the pipe.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec

__all__ = ["EXIT_CLOSED_PIPE", "EXIT_INTERRUPTED", "console_main"]

EXIT_CLOSED_PIPE = 141
EXIT_INTERRUPTED = 130

P = ParamSpec("P")


def console_main(main: Callable[P, int]) -> Callable[P, int]:
    """`main` with the closed-pipe and Ctrl-C handling above (the console script's target)."""

    @functools.wraps(main)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            code = main(*args, **kwargs)
            sys.stdout.flush()
        except BrokenPipeError:
            _stdout_to_devnull()
            return EXIT_CLOSED_PIPE
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        return code

    return guarded


def _stdout_to_devnull() -> None:
    """Nothing more can reach the reader; let the interpreter's last flush succeed."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout replaced by an object without a descriptor
        pass
