"""
The ``svc`` operator command.

Subcommands are added by the parts that own them (``svc chunk`` here;
``svc ca``, ``svc token``, ``svc user`` and the fleet commands ``svc
allocations``, ``agents``, ``usage``, ``gc``, ``purge`` by the control plane;
``svc audit`` by the audit package). Each subcommand module exposes ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from svc.version import version_line

# Modules that contribute subcommands, in help order.
SUBCOMMAND_MODULES = (
    "svc.chunking.cli",
    "svc.audit.cli",
    "svc.control.operator_cli",
    "svc.control.fleet_cli",
)


def build_parser() -> argparse.ArgumentParser:
    """
    The argument parser with every available subcommand registered.
    """
    parser = argparse.ArgumentParser(prog="svc", description="svc operator commands")
    parser.add_argument("--version", action="version", version=version_line("svc"))
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run one subcommand and return its exit status.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    status: int = args.run(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
