"""
The HTTP client both the data-plane server and the mount client use for calls
to the control plane.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import treq
from OpenSSL import crypto
from treq.client import HTTPClient
from twisted.internet.ssl import Certificate, trustRootFromCertificates
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS

from svc.config import ConfigError
from svc.pki.errors import PKIError
from svc.pki.pem import certs_from_pem


def control_plane_http_client(reactor: Any, ca_file: Path | None) -> Any:
    """
    A treq client for calls to the control plane. With C{ca_file} (PEM,
    C{SVC_CA_FILE}) HTTPS trusts only the certificates in it; without, the
    platform's trust store. A plain C{http://} control URL (the local
    development stack) works with either.
    """
    if ca_file is None:
        agent: Any = Agent(reactor)  # type: ignore[no-untyped-call]
        return HTTPClient(agent)
    anchors = [
        Certificate(crypto.X509.from_cryptography(c))  # type: ignore[no-untyped-call]
        for c in certs_from_pem(ca_file.read_bytes())
    ]
    trust = trustRootFromCertificates(anchors)  # type: ignore[no-untyped-call]
    policy = BrowserLikePolicyForHTTPS(trustRoot=trust)  # type: ignore[no-untyped-call]
    agent = Agent(reactor, contextFactory=policy)  # type: ignore[no-untyped-call]
    return HTTPClient(agent)


def check_ca_file(path: Path) -> None:
    """
    Refuse at start a C{SVC_CA_FILE} that L{control_plane_http_client}
    could not use: unreadable, or holding no PEM certificate.

    @raise ConfigError: naming C{SVC_CA_FILE}.
    """
    try:
        certs_from_pem(path.read_bytes())
    except OSError as e:
        raise ConfigError("SVC_CA_FILE", f"cannot read {path}: {e.strerror}") from None
    except PKIError as e:
        raise ConfigError("SVC_CA_FILE", str(e)) from None


class AnswerTooLarge(Exception):
    """An HTTP answer's body was longer than its caller allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer is larger than {limit} bytes")
        self.limit = limit


async def read_bounded(response: Any, limit: int) -> bytes:
    """
    The body of a treq C{response}, read as it arrives and given up past
    C{limit} bytes (L{AnswerTooLarge}): a peer cannot make the caller hold
    more.
    """
    parts: list[bytes] = []
    size = 0

    def collect(data: bytes) -> None:
        nonlocal size
        size += len(data)
        if size > limit:
            raise AnswerTooLarge(limit)
        parts.append(data)

    await treq.collect(response, collect)
    return b"".join(parts)
