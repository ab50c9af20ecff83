"""
The installed svc release, and the C{--version} option of every entry point
(C{svc}, C{twist svc-control}, C{twist svc-dataplane}, C{twist svc-mount}).

The line printed is C{<program> <release> (Python <x.y.z>, Twisted <x.y.z>)}:
the release is the installed distribution's (C{setup.cfg}'s C{version}), so
an operator can tell which build a host runs without any configuration (the
option is handled before the environment is read).
"""

from __future__ import annotations

import platform
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version
from typing import NoReturn, TextIO

from twisted import __version__ as twisted_version

DISTRIBUTION = "svc"
UNKNOWN = "unknown"


def release() -> str:
    """The installed svc release (C{unknown} when svc is not installed as a distribution)."""
    try:
        return distribution_version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN


def version_line(program: str) -> str:
    """C{<program> <release> (Python <version>, Twisted <version>)}."""
    return f"{program} {release()} (Python {platform.python_version()}, Twisted {twisted_version})"


def exit_with_version(program: str, out: TextIO | None = None) -> NoReturn:
    """
    Print L{version_line} on C{out} (stdout) and end the process with status
    0: the C{opt_version} of the taps' options (which replaces Twisted's
    own, which prints Twisted's version alone).
    """
    stream = sys.stdout if out is None else out
    stream.write(version_line(program) + "\n")
    stream.flush()
    raise SystemExit(0)
