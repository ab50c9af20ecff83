"""
The server's frame writer: large frames in slices, only while the transport
takes them, in order, without copying.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.answer_writer import AnswerWriter

SLICE = 100


class Transport:
    """Records the pieces written; pauses the writer once it holds C{room} bytes."""

    def __init__(self, room: int | None = None) -> None:
        self.pieces: list[memoryview] = []
        self.room = room
        self.held = 0
        self.writer: AnswerWriter | None = None

    def write(self, piece: memoryview) -> None:
        self.pieces.append(piece)
        self.held += len(piece)
        if self.room is not None and self.held > self.room and self.writer is not None:
            self.writer.pause()

    def drain(self) -> None:
        """The peer took everything: resume the writer."""
        self.held = 0
        assert self.writer is not None
        self.writer.resume()

    def data(self) -> bytes:
        return b"".join(bytes(piece) for piece in self.pieces)


def writer_on(transport: Transport) -> AnswerWriter:
    writer = AnswerWriter(transport.write, slice_bytes=SLICE)
    transport.writer = writer
    return writer


class AnswerWriterTests(SynchronousTestCase):
    """What goes out when."""

    def test_small_frame_goes_out_at_once_even_when_paused(self) -> None:
        """A frame no larger than a slice, with nothing queued, is written now and its then run."""
        transport = Transport()
        writer = writer_on(transport)
        writer.pause()
        done: list[bool] = []
        writer.write([b"head", b"tail"], lambda: done.append(True))
        self.assertEqual(transport.data(), b"headtail")
        self.assertEqual(done, [True])
        self.assertTrue(writer.idle)

    def test_large_frame_in_slices_while_the_transport_takes_them(self) -> None:
        """A large raw segment goes one slice per drain; then runs after the last slice."""
        transport = Transport(room=50)
        writer = writer_on(transport)
        raw = bytes(range(250))
        done: list[bool] = []
        writer.write([b"h" * 10, memoryview(raw)], lambda: done.append(True))
        self.assertEqual([len(p) for p in transport.pieces], [10, 90])
        self.assertEqual((done, writer.queued_bytes), ([], 160))
        transport.drain()
        self.assertEqual([len(p) for p in transport.pieces], [10, 90, 100])
        transport.drain()
        self.assertEqual(done, [True])
        self.assertEqual(transport.data(), b"h" * 10 + raw)
        self.assertTrue(writer.idle)
        self.assertEqual((writer.queued_bytes, writer.queued_payload_bytes), (0, 0))

    def test_chunk_bytes_not_copied(self) -> None:
        """The pieces of a raw segment are views of the segment itself."""
        transport = Transport()
        writer = writer_on(transport)
        raw = bytes(300)
        writer.write([b"h", memoryview(raw)])
        self.assertTrue(all(piece.obj is raw for piece in transport.pieces[1:]))

    def test_mutable_parts_copied_when_queued(self) -> None:
        """A part that could change while it waits is copied when queued."""
        transport = Transport(room=0)
        writer = writer_on(transport)
        writer.pause()
        body = bytearray(b"x" * 150)
        writer.write([b"h", body])
        body[:] = b"y" * 150
        transport.drain()
        transport.drain()
        self.assertEqual(transport.data(), b"h" + b"x" * 150)

    def test_frames_keep_their_order(self) -> None:
        """A small frame written while a large one is queued waits behind it."""
        transport = Transport(room=50)
        writer = writer_on(transport)
        writer.write([b"A", bytes(200)])
        writer.write([b"B"])
        self.assertNotIn(b"B", transport.data())
        self.assertEqual(writer.queued_payload_bytes, 2)
        for _ in range(3):
            transport.drain()
        self.assertEqual(transport.data(), b"A" + bytes(200) + b"B")

    def test_discard_runs_every_then(self) -> None:
        """Dropping the queue runs each frame's then once; nothing more is written."""
        transport = Transport(room=0)
        writer = writer_on(transport)
        done: list[str] = []
        writer.write([b"A", bytes(200)], lambda: done.append("A"))
        writer.write([b"B", bytes(200)], lambda: done.append("B"))
        written = len(transport.pieces)
        writer.discard()
        self.assertEqual(done, ["A", "B"])
        writer.resume()
        self.assertEqual(len(transport.pieces), written)
        self.assertEqual(writer.queued_bytes, 0)

    def test_when_idle(self) -> None:
        """when_idle runs at once when idle, else after the last queued frame is handed on."""
        transport = Transport(room=0)
        writer = writer_on(transport)
        ran: list[int] = []
        writer.when_idle(lambda: ran.append(1))
        writer.write([b"A", bytes(150)])
        writer.when_idle(lambda: ran.append(2))
        self.assertEqual(ran, [1])
        transport.drain()
        transport.drain()
        self.assertEqual(ran, [1, 2])

    def test_failing_then_is_logged(self) -> None:
        """A then that raises is logged; writing goes on."""
        transport = Transport()
        writer = writer_on(transport)

        def broken() -> None:
            raise RuntimeError("boom")

        writer.write([b"A"], broken)
        writer.write([b"B"])
        self.assertEqual(transport.data(), b"AB")
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
