"""
The test vectors of ``docs/specifications/chunking.md``: the code cuts them as
listed, and the document lists them as the code cuts them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from blake3 import blake3
from pyfastcdc.py.constants import GEAR
from twisted.trial.unittest import SynchronousTestCase

from svc.chunking.core import ChunkRef, chunk_bytes
from svc.chunking.test import reference
from svc.chunking.test.inputs import xof

SPEC = Path(__file__).resolve().parents[3] / "docs" / "specifications" / "chunking.md"

GEAR_TABLE_BLAKE3 = "b8a753f2311fec47b05c45684efb67446afda746e79321a9fda3cb72d850a171"

# name -> (how to build the input, first 16 bytes of an XOF input or None, chunks)
VECTORS: dict[str, tuple[Callable[[], bytes], str | None, list[tuple[int, int, str]]]] = {}


def _vector(
    name: str,
    data: Callable[[], bytes],
    first16: str | None,
    chunks: list[tuple[int, int, str]],
) -> None:
    VECTORS[name] = (data, first16, chunks)


_vector(
    "short",
    lambda: xof(b"svc-chunking/v1/short", 1_000_000),
    "f1dfee196397da88d705beffcd8f5bd6",
    [(0, 1000000, "a2eda4463944048f4ceb9cab6879574cd0f8ef8a956ce8fa1027e3533b5954b9")],
)
_vector(
    "random",
    lambda: xof(b"svc-chunking/v1/random", 50_000_017),
    "f8cfb3bca8af504b306551164a66e240",
    [
        (0, 6457883, "96900d3802e8c767077002f9e9be5c6c259ca14bb0409706aaf2188ef21f60a3"),
        (6457883, 2299945, "4e8191b2ead2b275dfb721a18631a45fa20b3740a8c9e8d5a3dc82f435639aec"),
        (8757828, 6478186, "83a621b63e487c256795bec89b4d9335193d82c56345dba6b78887c5e7fab1b8"),
        (15236014, 5901876, "ad0a71e78646bbb5fd8a729bf89633766219debfca7b67b9afdd221da0e90142"),
        (21137890, 5158352, "931be938ef4c9f51275c665558e65ff5eef3b781f4405b510209464339c81cf2"),
        (26296242, 5014813, "49fa059c279d2b6a5935bfd4cd499e2c92ac614710ec34e3b3f7eed0fee63fa5"),
        (31311055, 2096744, "8558fc945b3bf75d405c55b577de4b2790157860445c4366da8f7052a8cbee73"),
        (33407799, 5815963, "1eca7cbc8485ddfa0cff8dc9196fb38218bd4bcedda8c12a1e04c3a66790a7ce"),
        (39223762, 8606230, "f1a5d13b2b05b9eceb9c0b8dcd2a01f53acc890a58e0b92d6552403a31d26143"),
        (47829992, 2170025, "43f172f7d7f1a0a67b77e429b81f9c7ce6037e8b82798c42fc898b90dbd900ce"),
    ],
)
_vector(
    "zeros",
    lambda: bytes(33_554_437),
    None,
    [
        (0, 16777216, "b4834959bc889fed1abf3c45d5da0e384134386a4b2786cc5dbb9fe8fa853bbb"),
        (16777216, 16777216, "b4834959bc889fed1abf3c45d5da0e384134386a4b2786cc5dbb9fe8fa853bbb"),
        (33554432, 5, "cdc96eca844d7912acdbb3dca677757d0db5747a1df61166339cfc7156d4880f"),
    ],
)
_REPEATED = "ec8106aaeebbd6b73cc643484e833a5af149aa566a4f0da9d3fa415a0b8fe740"
_vector(
    "repeat",
    lambda: xof(b"svc-chunking/v1/block", 5_242_880) * 6,
    "fca4c1e7c19e3e3e84dd4cb239a5787a",
    [
        (0, 8454196, "83f06cc2fb8a8cdd60aea44cc71d519209a515c8fd34e267db555e31dc8c82f6"),
        (8454196, 5242880, _REPEATED),
        (13697076, 5242880, _REPEATED),
        (18939956, 5242880, _REPEATED),
        (24182836, 5242880, _REPEATED),
        (29425716, 2031564, "a704440ba6d2142c7609588a48e031797d86176ef421f816cab0a5651d6fd1e9"),
    ],
)


def _render(chunks: list[tuple[int, int, str]]) -> str:
    lines = [f"{'offset':>10} {'length':>10}  blake3"]
    lines += [f"{offset:>10} {length:>10}  {name}" for offset, length, name in chunks]
    return "```text\n" + "\n".join(lines) + "\n```\n"


class VectorTests(SynchronousTestCase):
    """
    The specification's vectors.
    """

    def test_empty(self) -> None:
        """Empty input has no chunks."""
        self.assertEqual(chunk_bytes(b""), [])

    def test_vectors(self) -> None:
        """Each vector's input is cut into exactly the listed chunks."""
        for name, (build, first16, chunks) in VECTORS.items():
            data = build()
            if first16 is not None:
                self.assertEqual(data[:16].hex(), first16, name)
            self.assertEqual(chunk_bytes(data), [ChunkRef(*chunk) for chunk in chunks], name)

    def test_gear_table(self) -> None:
        """The gear table is MD5-derived as specified and has the published checksum."""
        table = reference.gear_table()
        self.assertEqual(table, list(GEAR))
        packed = b"".join(entry.to_bytes(8, "big") for entry in table)
        self.assertEqual(blake3(packed).hexdigest(), GEAR_TABLE_BLAKE3)

    def test_document_matches(self) -> None:
        """The document lists every vector, the gear checksum and the masks as the code has them."""
        if not SPEC.exists():
            self.skipTest(f"{SPEC} is not part of this installation")
        text = SPEC.read_text(encoding="utf-8")
        for name, (_data, first16, chunks) in VECTORS.items():
            self.assertIn(f"### `{name}`", text)
            self.assertIn(_render(chunks), text, name)
            if first16 is not None:
                self.assertIn(f"`{first16}`", text, name)
        self.assertIn(GEAR_TABLE_BLAKE3, text)
        self.assertIn(f"`0x{reference.MASK_S:016x}`", text)
        self.assertIn(f"`0x{reference.MASK_L:016x}`", text)
