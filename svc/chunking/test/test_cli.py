"""
Tests for the C{svc chunk} subcommand, L{svc.chunking.cli}.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator

from twisted.trial.unittest import SynchronousTestCase

from svc.chunking.cli import run
from svc.chunking.core import chunk_bytes
from svc.chunking.test.inputs import MiB, xof
from svc.cli import build_parser


def _ticks(*values: float) -> Iterator[float]:
    yield from values


class ChunkCommandTests(SynchronousTestCase):
    """
    C{svc chunk FILE [--json]}.
    """

    def setUp(self) -> None:
        self.data = xof(b"cli", 9 * MiB + 1)
        self.path = self.mktemp()
        with open(self.path, "wb") as handle:
            handle.write(self.data)
        self.out = io.StringIO()
        self.err = io.StringIO()

    def _chunk(self, *argv: str) -> int:
        args = build_parser().parse_args(["chunk", *argv])
        clock = _ticks(10.0, 10.5)
        return run(args, out=self.out, err=self.err, clock=lambda: next(clock))

    def test_registered(self) -> None:
        """The svc command knows the chunk subcommand and dispatches to run."""
        args = build_parser().parse_args(["chunk", "x", "--json"])
        self.assertIs(args.run, run)
        self.assertEqual((args.file, args.json), ("x", True))

    def test_table(self) -> None:
        """The table lists index, offset, length and name, then a summary line."""
        self.assertEqual(self._chunk(self.path), 0)
        lines = self.out.getvalue().splitlines()
        refs = chunk_bytes(self.data)
        self.assertEqual(lines[0].split(), ["index", "offset", "length", "blake3"])
        self.assertEqual(
            [line.split() for line in lines[1:-1]],
            [[str(i), str(r.offset), str(r.length), r.hash] for i, r in enumerate(refs)],
        )
        # 9 MiB + 1 byte in the clock's 0.5 seconds: 18.9 MB/s.
        self.assertEqual(
            lines[-1],
            f"chunks: {len(refs)}  bytes: {len(self.data)}  seconds: 0.500  MB/s: 18.9",
        )
        self.assertEqual(self.err.getvalue(), "")

    def test_json(self) -> None:
        """--json prints one document with the chunk list and the summary."""
        self.assertEqual(self._chunk(self.path, "--json"), 0)
        document = json.loads(self.out.getvalue())
        refs = chunk_bytes(self.data)
        self.assertEqual(document["file"], self.path)
        self.assertEqual(
            document["chunks"],
            [
                {"index": i, "offset": r.offset, "length": r.length, "blake3": r.hash}
                for i, r in enumerate(refs)
            ],
        )
        self.assertEqual(
            document["summary"],
            {"chunks": len(refs), "bytes": len(self.data), "seconds": 0.5, "mb_s": 18.9},
        )

    def test_empty_file(self) -> None:
        """An empty file has no chunks and a zero summary."""
        empty = self.mktemp()
        open(empty, "wb").close()
        self.assertEqual(self._chunk(empty, "--json"), 0)
        document = json.loads(self.out.getvalue())
        self.assertEqual(document["chunks"], [])
        self.assertEqual(document["summary"]["bytes"], 0)

    def _assert_one_line_error(self, status: int, fragment: str) -> None:
        self.assertEqual(status, 1)
        self.assertEqual(self.out.getvalue(), "")
        message = self.err.getvalue()
        self.assertEqual(message.count("\n"), 1)
        self.assertTrue(message.startswith("svc chunk: error: "), message)
        self.assertIn(fragment, message)
        self.assertNotIn("Traceback", message)

    def test_missing_file(self) -> None:
        """A missing file exits 1 with one line naming the problem."""
        missing = self.mktemp()
        self._assert_one_line_error(self._chunk(missing), "No such file or directory")

    def test_directory(self) -> None:
        """A directory exits 1 with one line."""
        directory = self.mktemp()
        os.mkdir(directory)
        self._assert_one_line_error(self._chunk(directory), "is a directory")

    def test_not_regular(self) -> None:
        """A FIFO (which would block) is refused without being opened."""
        fifo = self.mktemp()
        os.mkfifo(fifo)
        self._assert_one_line_error(self._chunk(fifo), "not a regular file")

    def test_unreadable(self) -> None:
        """A file that cannot be opened exits 1 with one line."""
        if os.geteuid() == 0:
            self.skipTest("root reads files regardless of mode")
        os.chmod(self.path, 0)
        self._assert_one_line_error(self._chunk(self.path), "Permission denied")
