"""
Checks that C{docs/specifications/wire.md} agrees with the code: the worked
examples, the errno table, the frame type table and the operations table
(generated from the declarations, L{svc.wire.document}).
"""

from __future__ import annotations

import re
from pathlib import Path

from twisted.trial.unittest import SkipTest, SynchronousTestCase

import svc
from svc.wire.control import Hello, error_frame, hello_frame
from svc.wire.decoder import FrameDecoder
from svc.wire.document import BEGIN, END, commands_table
from svc.wire.errno import WireErrno
from svc.wire.frame import Frame, FrameType, encode_frame
from svc.wire.ops import PUSH_OPS, Op

DOCUMENT = Path(svc.__file__).resolve().parent.parent / "docs" / "specifications" / "wire.md"

EXAMPLES = {
    "response": Frame(FrameType.RESPONSE, 5, {"size": 5}, b"hello"),
    "error": error_frame(9, WireErrno.ESTALE, "version changed", {"current_version": 4}),
    "hello": hello_frame(Hello()),
}


def read_document() -> str:
    """The specification's text; skip when svc runs from an install without docs."""
    if not DOCUMENT.exists():
        raise SkipTest(f"{DOCUMENT} not present")
    return DOCUMENT.read_text(encoding="utf-8")


def example_bytes(text: str, name: str) -> bytes:
    """The bytes of the hex dump marked C{<!-- wire-example: name -->}."""
    match = re.search(rf"<!-- wire-example: {name} -->\s*```text\n(.*?)```", text, flags=re.DOTALL)
    if match is None:
        raise AssertionError(f"example {name!r} missing from {DOCUMENT}")
    data = bytearray()
    for line in match.group(1).splitlines():
        offset, _, hex_bytes = line.partition("  ")
        if int(offset, 16) != len(data):
            raise AssertionError(f"example {name!r}: offset {offset} out of step")
        data += bytes.fromhex(hex_bytes)
    return bytes(data)


class DocumentTests(SynchronousTestCase):
    """
    The wire specification cannot drift from the code.
    """

    def test_examples_match_encoder(self) -> None:
        """Every worked example's hex dump is exactly what the encoder produces."""
        text = read_document()
        for name, frame in EXAMPLES.items():
            self.assertEqual(example_bytes(text, name), b"".join(encode_frame(frame)), name)

    def test_examples_decode(self) -> None:
        """Every worked example's hex dump decodes to its frame."""
        text = read_document()
        for name, frame in EXAMPLES.items():
            self.assertEqual(FrameDecoder().feed(example_bytes(text, name)), [frame], name)

    def test_errno_table(self) -> None:
        """The errno table lists every L{WireErrno} with its number, and nothing else."""
        text = read_document()
        rows = dict(re.findall(r"^\| `(E[A-Z]+)` \| (\d+) \|", text, flags=re.MULTILINE))
        self.assertEqual(rows, {member.name: str(member.value) for member in WireErrno})

    def test_frame_type_table(self) -> None:
        """The frame type table lists every L{FrameType} with its number."""
        text = read_document()
        rows = dict(re.findall(r"^\| (\d+) \| `([A-Z]+)` \|", text, flags=re.MULTILINE))
        self.assertEqual(rows, {str(member.value): member.name for member in FrameType})

    def test_operation_table(self) -> None:
        """The operations table is exactly what the declarations generate, every op in it."""
        text = read_document()
        start = text.index(BEGIN) + len(BEGIN)
        block = text[start : text.index(END)].strip()
        self.assertEqual(block, commands_table(), "regenerate: python -m svc.wire.document")
        rows = re.findall(r"^\| `([a-z_]+)`( \(PUSH\))? \|", block, flags=re.MULTILINE)
        expected = {op.value: " (PUSH)" if op in PUSH_OPS else "" for op in Op}
        self.assertEqual(dict(rows), expected)
