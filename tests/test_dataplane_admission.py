"""
System tests of data-plane admission against a real C{twist svc-dataplane}
process, driven by the real client over loopback TLS:

  - a good agent gets HELLO and can ping; every certificate breaking an
    admission rule (and a client without a certificate, or limited to
    TLS 1.2) is dropped before any frame;
  - a deny-list push refuses new connections of that serial and closes a
    live one, while another agent's connection stays up;
  - garbage after HELLO closes that connection only, without a traceback in
    the server log.
"""

from __future__ import annotations

import os
import ssl
import struct
from typing import Any

from twisted.internet import reactor
from twisted.trial.unittest import TestCase

from svc.dataplane_client.client import DataPlaneClient
from svc.dataplane_client.errors import AdmissionFailed, NotExecuted
from svc.testing.pki import AgentCredentials
from svc.wire.control import read_error, read_goaway
from svc.wire.decoder import FrameDecoder
from svc.wire.errno import WireErrno
from svc.wire.frame import FRAMES_TO_CLIENT, Frame, FrameType, encode_frame
from tests.dataplane_harness import (
    DataPlaneProcess,
    async_test,
    bounded,
    class_server,
    connect_agent,
    connect_with,
    raw_tls_socket,
    serial_of,
    standard_server,
)

_reactor: Any = reactor


class AdmissionSystemCase(TestCase):
    """Shared set-up: this class's server process and a client helper."""

    def setUp(self) -> None:
        self.server: DataPlaneProcess = class_server(self, standard_server)
        self.pki = self.server.pki

    async def connect(self, credentials: AgentCredentials) -> DataPlaneClient:
        """An admitted client for C{credentials}, closed after the test."""
        client = await connect_agent(_reactor, self.server, credentials)
        self.addCleanup(client.close)
        return client

    async def assertRefused(self, connecting: Any) -> AdmissionFailed:
        """C{connecting} fails with AdmissionFailed (no HELLO ever arrived)."""
        try:
            client = await connecting
        except AdmissionFailed as e:
            return e
        await client.close()
        raise self.failureException("the connection was admitted")


class AdmissionTests(AdmissionSystemCase):
    """
    Who gets a HELLO from the real server.
    """

    @async_test
    async def test_good_agent(self) -> None:
        """A good agent is admitted (HELLO names the server) and can ping."""
        client = await self.connect(self.pki.agent("tenant-a", "agent-1"))
        self.assertEqual(client.hello.server, "svc-dataplane")
        reply = await client.call("ping")
        self.assertEqual(dict(reply.payload), {})

    @async_test
    async def test_bad_certificates_dropped(self) -> None:
        """Each certificate breaking one admission rule is dropped before any frame."""
        for rule, credentials in self.pki.bad_agents().items():
            error = await self.assertRefused(connect_agent(_reactor, self.server, credentials))
            self.assertIn("before HELLO" if error.handshake_completed else "handshake", str(error))
            if rule in ("tenant_only", "cross_tenant_intermediate"):
                # These chains verify; only the server's admission refuses them.
                self.assertTrue(error.handshake_completed, rule)
        client = await self.connect(self.pki.agent("tenant-a", "agent-1"))
        await client.call("ping")

    @async_test
    async def test_no_client_certificate(self) -> None:
        """A client presenting no certificate never gets a frame."""
        await self.assertRefused(
            connect_with(_reactor, self.server, self.pki.no_certificate_options())
        )

    @async_test
    async def test_tls12_client(self) -> None:
        """A good agent on a client limited to TLS 1.2 fails the handshake."""
        creator = self.pki.tls12_options(self.pki.agent("tenant-a", "agent-1"))
        error = await self.assertRefused(connect_with(_reactor, self.server, creator))
        self.assertFalse(error.handshake_completed)

    @async_test
    async def test_deny_listed_serial(self) -> None:
        """After a revocation push, that serial is dropped; another serial is not."""
        denied = self.pki.agent("tenant-a", "denied-1")
        other = self.pki.agent("tenant-a", "denied-1")
        self.server.push_revocations([serial_of(denied)])
        self.addCleanup(self.server.push_revocations, [])
        error = await self.assertRefused(connect_agent(_reactor, self.server, denied))
        self.assertTrue(error.handshake_completed)
        client = await self.connect(other)
        await client.call("ping")


class LiveRevocationTests(AdmissionSystemCase):
    """
    A deny-list push reaches connections that are already open.
    """

    @async_test
    async def test_push_closes_live_connection(self) -> None:
        """The denied serial's live connection gets GOAWAY and closes; others stay up."""
        credentials = self.pki.agent("tenant-a", "live-victim")
        victim = await self.connect(credentials)
        # Another leaf (serial) of the same agent, and another tenant's agent.
        same_agent = await self.connect(self.pki.agent("tenant-a", "live-victim"))
        other_tenant = await self.connect(self.pki.agent("tenant-b", "live-2"))
        await victim.call("ping")

        self.server.push_revocations([serial_of(credentials)])
        self.addCleanup(self.server.push_revocations, [])
        await bounded(victim.when_closed(), _reactor)
        assert victim.going_away is not None
        self.assertEqual(victim.going_away.reason, "credentials_expired")
        with self.assertRaises(NotExecuted):
            await victim.call("ping")
        await same_agent.call("ping")
        await other_tenant.call("ping")


def read_frames(sock: ssl.SSLSocket, until_eof: bool) -> tuple[list[Frame], bool]:
    """
    Frames the server sent on a raw socket: the first batch (HELLO), or
    everything until the connection ends; and whether it ended.
    """
    decoder = FrameDecoder(accept=FRAMES_TO_CLIENT)
    frames: list[Frame] = []
    while True:
        try:
            data = sock.recv(65536)
        except (ssl.SSLError, ConnectionError):
            return frames, True
        if not data:
            return frames, True
        frames.extend(decoder.feed(data))
        if frames and not until_eof:
            return frames, False


def header(frame_type: int, request_id: int, payload_length: int, raw_length: int = 0) -> bytes:
    """A frame header (wire.md section 2) with the given fields."""
    return struct.pack(
        ">4sBBBBIII", b"SVCW", 1, frame_type, 0, 0, request_id, payload_length, raw_length
    )


class MalformedFrameTests(AdmissionSystemCase):
    """
    Garbage from an admitted peer ends that connection and nothing else.
    """

    GARBAGE = {
        "random bytes": b"\x00" + os.urandom(4095),
        "frame type a server never receives": header(FrameType.HELLO.value, 0, 1) + b"\x80",
        "oversized payload length": header(FrameType.REQUEST.value, 1, 0xFFFFFFFF),
    }

    @async_test
    async def test_garbage_closes_only_that_connection(self) -> None:
        """Each kind of garbage after HELLO closes that connection; another stays up."""
        credentials = self.pki.agent("tenant-a", "garbage-1")
        bystander = await self.connect(self.pki.agent("tenant-a", "bystander-1"))
        for name, garbage in self.GARBAGE.items():
            with raw_tls_socket(self.server, credentials) as sock:
                hello, _ = read_frames(sock, until_eof=False)
                self.assertEqual([f.type for f in hello], [FrameType.HELLO], name)
                sock.sendall(garbage)
                frames, ended = read_frames(sock, until_eof=True)
            self.assertTrue(ended, name)
            self.assertEqual(
                [read_goaway(f).reason for f in frames if f.type is FrameType.GOAWAY],
                ["protocol_error"][: len(frames)],
                name,
            )
            self.assertEqual([f.type for f in frames if f.type is not FrameType.GOAWAY], [], name)
            await bystander.call("ping")
        log = self.server.log_text()
        self.assertNotIn("Traceback", log)
        self.assertNotIn("Unhandled", log)

    @async_test
    async def test_bad_request_payload_is_answered_and_the_connection_stays(self) -> None:
        """
        A REQUEST whose payload is not a map is answered EPROTO (its frame's
        boundaries were intact: wire.md section 3.1) and the connection serves on.
        """
        credentials = self.pki.agent("tenant-a", "garbage-2")
        with raw_tls_socket(self.server, credentials) as sock:
            read_frames(sock, until_eof=False)
            ping = encode_frame(Frame(FrameType.REQUEST, 2, {"op": "ping"}))
            sock.sendall(header(FrameType.REQUEST.value, 1, 64) + b"\xc1" * 64 + b"".join(ping))
            frames: list[Frame] = []
            while len(frames) < 2:
                more, ended = read_frames(sock, until_eof=False)
                frames += more
                self.assertFalse(ended)
        self.assertEqual(
            [(f.type, f.request_id) for f in frames],
            [
                (FrameType.ERROR, 1),
                (FrameType.RESPONSE, 2),
            ],
        )
        self.assertEqual(read_error(frames[0]).errno, WireErrno.EPROTO)
