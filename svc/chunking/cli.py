"""
``svc chunk FILE [--json]``: cut a file the way the service does and print
its chunk table (index, offset, length, BLAKE3 name) and a summary (chunks,
bytes, throughput in MB/s, where 1 MB = 10**6 bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from svc.chunking.core import ChunkRef
from svc.chunking.stream import chunk_stream

Clock = Callable[[], float]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """
    Add the C{chunk} subcommand to the C{svc} command's subparsers.
    """
    parser = subparsers.add_parser(
        "chunk",
        help="cut a file into content-defined chunks and print them",
        description=(
            "Cut FILE into content-defined chunks (FastCDC 2020: min 1 MiB, "
            "average 4 MiB, max 16 MiB), name each by BLAKE3, and print the "
            "chunk table and a summary."
        ),
    )
    parser.add_argument("file", metavar="FILE", help="regular file to cut")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document instead of a table"
    )
    parser.set_defaults(run=run)


def _problem(path: str) -> str | None:
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        return f"{path}: {error.strerror or error}"
    if stat.S_ISDIR(mode):
        return f"{path}: is a directory"
    if not stat.S_ISREG(mode):
        return f"{path}: not a regular file"
    return None


def run(
    args: argparse.Namespace,
    out: TextIO | None = None,
    err: TextIO | None = None,
    clock: Clock = time.perf_counter,
) -> int:
    """
    Run C{svc chunk}; return the exit status (0 success, 1 error).

    Errors (missing file, a directory, unreadable) print one line to C{err}
    and no traceback.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    path: str = args.file
    problem = _problem(path)
    if problem is None:
        started = clock()
        try:
            refs = chunk_stream(path)
        except OSError as error:
            problem = f"{path}: {error.strerror or error}"
        else:
            seconds = clock() - started
    if problem is not None:
        err.write(f"svc chunk: error: {problem}\n")
        return 1
    total = sum(ref.length for ref in refs)
    rate = total / seconds / 1e6 if seconds > 0 else 0.0
    if args.json:
        _write_json(out, path, refs, total, seconds, rate)
    else:
        _write_table(out, refs, total, seconds, rate)
    return 0


def _write_json(
    out: TextIO, path: str, refs: list[ChunkRef], total: int, seconds: float, rate: float
) -> None:
    document = {
        "file": path,
        "chunks": [
            {"index": index, "offset": ref.offset, "length": ref.length, "blake3": ref.hash}
            for index, ref in enumerate(refs)
        ],
        "summary": {
            "chunks": len(refs),
            "bytes": total,
            "seconds": round(seconds, 6),
            "mb_s": round(rate, 1),
        },
    }
    out.write(json.dumps(document, indent=2) + "\n")


def _write_table(
    out: TextIO, refs: list[ChunkRef], total: int, seconds: float, rate: float
) -> None:
    out.write(f"{'index':>5}  {'offset':>14}  {'length':>10}  blake3\n")
    for index, ref in enumerate(refs):
        out.write(f"{index:>5}  {ref.offset:>14}  {ref.length:>10}  {ref.hash}\n")
    out.write(f"chunks: {len(refs)}  bytes: {total}  seconds: {seconds:.3f}  MB/s: {rate:.1f}\n")
