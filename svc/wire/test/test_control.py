"""
Tests for L{svc.wire.control}: ERROR, HELLO and GOAWAY frames.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.wire.control import (
    DEFAULT_MAX_IN_FLIGHT,
    ErrorInfo,
    GoAway,
    GoAwayReason,
    Hello,
    error_frame,
    goaway_frame,
    hello_frame,
    read_error,
    read_goaway,
    read_hello,
)
from svc.wire.decoder import FrameDecoder
from svc.wire.errno import WireErrno
from svc.wire.errors import CodecError
from svc.wire.frame import MAX_PAYLOAD_SIZE, MAX_RAW_SIZE, Frame, FrameType, encode_frame


def round_trip(frame: Frame) -> Frame:
    """Encode C{frame}, decode it again and return the single frame."""
    [decoded] = FrameDecoder().feed(b"".join(encode_frame(frame)))
    return decoded


class ErrorFrameTests(SynchronousTestCase):
    """
    Tests for L{error_frame} and L{read_error}.
    """

    def test_round_trip(self) -> None:
        """An ERROR frame's errno, message and details come back as sent."""
        frame = error_frame(4, WireErrno.ESTALE, "lost race", {"current_version": 9})
        self.assertEqual(frame.payload["errno"], 116)
        self.assertEqual(
            read_error(round_trip(frame)),
            ErrorInfo(WireErrno.ESTALE, "lost race", {"current_version": 9}),
        )

    def test_details_optional(self) -> None:
        """Without details the key is left out and reads back as an empty map."""
        frame = error_frame(1, WireErrno.ENOENT, "")
        self.assertNotIn("details", frame.payload)
        self.assertEqual(read_error(round_trip(frame)).details, {})

    def test_errno_must_be_wire_errno(self) -> None:
        """A plain integer, even a valid number, is refused as the errno."""
        self.assertRaises(CodecError, error_frame, 1, 2, "x")

    def test_unknown_errno_reads_as_eio(self) -> None:
        """An errno number this side does not know reads as EIO."""
        frame = Frame(FrameType.ERROR, 1, {"errno": 4000, "message": "new"})
        self.assertIs(read_error(round_trip(frame)).errno, WireErrno.EIO)

    def test_unknown_keys_ignored(self) -> None:
        """Extra payload keys do not disturb reading an ERROR frame."""
        frame = Frame(FrameType.ERROR, 1, {"errno": 2, "message": "m", "hint": 1})
        self.assertEqual(read_error(frame), ErrorInfo(WireErrno.ENOENT, "m"))

    def test_wrong_type(self) -> None:
        """Reading a RESPONSE as an ERROR is refused."""
        self.assertRaises(CodecError, read_error, Frame(FrameType.RESPONSE, 1, {}))


class HelloTests(SynchronousTestCase):
    """
    Tests for L{Hello}, L{hello_frame} and L{read_hello}.
    """

    def test_defaults(self) -> None:
        """The default HELLO offers version 1 and the protocol's default limits."""
        hello = Hello()
        self.assertEqual(
            (hello.versions, hello.max_payload, hello.max_raw, hello.max_in_flight),
            ((1,), MAX_PAYLOAD_SIZE, MAX_RAW_SIZE, DEFAULT_MAX_IN_FLIGHT),
        )

    def test_round_trip(self) -> None:
        """Every HELLO field comes back as sent."""
        hello = Hello((1, 3), 65536, 1024, 8, "svc/0.1")
        frame = hello_frame(hello)
        self.assertEqual(frame.request_id, 0)
        self.assertEqual(read_hello(round_trip(frame)), hello)

    def test_versions_sorted(self) -> None:
        """Versions listed in any order read back ascending."""
        frame = Frame(
            FrameType.HELLO,
            0,
            {"versions": [3, 1], "max_payload": 1, "max_raw": 1, "max_in_flight": 1},
        )
        self.assertEqual(read_hello(frame).versions, (1, 3))

    def test_common_version(self) -> None:
        """The common version is the highest both list, or None when they share none."""
        self.assertEqual(Hello(versions=(1, 2, 5)).common_version((1, 2, 4)), 2)
        self.assertEqual(Hello(versions=(1,)).common_version(), 1)
        self.assertIsNone(Hello(versions=(2,)).common_version((1,)))

    def test_invalid_limits(self) -> None:
        """A HELLO with a limit out of range cannot be built."""
        self.assertRaises(CodecError, hello_frame, Hello(max_in_flight=0))
        self.assertRaises(CodecError, hello_frame, Hello(versions=()))


class GoAwayTests(SynchronousTestCase):
    """
    Tests for L{GoAway}, L{goaway_frame} and L{read_goaway}.
    """

    def test_round_trip(self) -> None:
        """Reason and message come back as sent, as plain strings."""
        frame = goaway_frame(GoAway(GoAwayReason.IDLE_TIMEOUT, "idle 300s"))
        self.assertIs(type(frame.payload["reason"]), str)
        self.assertEqual(read_goaway(round_trip(frame)), GoAway("idle_timeout", "idle 300s"))

    def test_message_optional(self) -> None:
        """Without a message the key is left out and reads back empty."""
        frame = goaway_frame(GoAway("shutdown"))
        self.assertEqual(frame.payload, {"reason": "shutdown"})
        self.assertEqual(read_goaway(round_trip(frame)).message, "")

    def test_reason_must_be_text(self) -> None:
        """A non-string reason is refused."""
        self.assertRaises(CodecError, goaway_frame, GoAway(3))  # type: ignore[arg-type]
