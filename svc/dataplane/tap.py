"""
``twist svc-dataplane``: options and service construction.

This part is not built yet: its options refuse to run rather than pretend.
"""

from __future__ import annotations

from twisted.application.service import IService
from twisted.python import usage

NOT_BUILT = (
    "svc-dataplane is not built yet in this release; "
    "see README.md for what currently works."
)


class Options(usage.Options):
    """
    Command-line options for ``twist svc-dataplane``.
    """

    def postOptions(self) -> None:
        raise usage.UsageError(NOT_BUILT)


def makeService(options: Options) -> IService:
    """
    Refuse: the part is not built yet.
    """
    raise SystemExit(NOT_BUILT)
