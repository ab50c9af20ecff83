"""
The mount client's agent credentials: the leaf, key and CA chain an
enrollment (or a renewal) returned, with the enrollment's metadata, and
their on-disk form so a restarted mount can reuse a live leaf (the enroll
token is single-use).

On disk the credentials are one JSON file, L{CREDENTIALS_FILE}, mode 0600 in
a directory of mode 0700, replaced atomically (L{svc.durable}): a crash
leaves either the old complete set or the new one, never a leaf beside
another leaf's key. L{save_credentials} and L{load_credentials} block; run
them through an L{svc.worker.IWorker}.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator

from svc.durable import make_directories, write_file_atomically
from svc.pki import names
from svc.pki.errors import PKIError
from svc.pki.pem import cert_from_pem, certs_from_pem, key_from_pem, split_ca_chain
from svc.pki.tls import client_tls_options

__all__ = [
    "CREDENTIALS_FILE",
    "AgentCredentials",
    "CredentialsError",
    "load_credentials",
    "save_credentials",
]

CREDENTIALS_FILE = "agent-credentials.json"
FILE_VERSION = 1

_TEXT_FIELDS = (
    "serial",
    "agent_fingerprint",
    "server_addr",
    "server_name",
    "allocation_id",
)


class CredentialsError(ValueError):
    """An enrollment answer or a stored credentials file is unusable."""


def leaf_fingerprint(leaf: x509.Certificate) -> str:
    """The SHA-256 of the leaf's DER as 64 lowercase hex digits (the control plane's form)."""
    return hashlib.sha256(leaf.public_bytes(serialization.Encoding.DER)).hexdigest()


def _parse_time(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"timestamp without a time zone: {text!r}")
    return moment.astimezone(UTC)


def _format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.frozen
class AgentCredentials:
    """
    An agent leaf with its key and chain, as the control plane returned it.

    @ivar chain_pem: the tenant intermediate, then the org root.
    @ivar not_after: the leaf's expiry (the response's C{expires_at}).
    @ivar server_name: the DNS name the data-plane server's leaf carries.
    """

    leaf_pem: bytes
    key_pem: bytes = attrs.field(repr=False)
    chain_pem: bytes
    serial: str
    not_after: datetime
    agent_fingerprint: str
    server_addr: str
    server_name: str
    allocation_id: str

    @classmethod
    def from_enrollment(cls, body: Mapping[str, Any]) -> AgentCredentials:
        """
        The credentials of an enrollment (or renewal) response body, checked:
        the key belongs to the leaf, the chain is an intermediate then a root,
        the serial and fingerprint are the leaf's.

        @raise CredentialsError: the body is not such a response.
        """
        texts: dict[str, str] = {}
        for name in (
            "client_cert_pem",
            "client_key_pem",
            "ca_chain_pem",
            "expires_at",
            *_TEXT_FIELDS,
        ):
            value = body.get(name)
            if not isinstance(value, str) or not value:
                raise CredentialsError(f"missing or empty field {name!r}")
            texts[name] = value
        try:
            not_after = _parse_time(texts["expires_at"])
        except ValueError as e:
            raise CredentialsError(f"bad expires_at: {e}") from None
        creds = cls(
            leaf_pem=texts["client_cert_pem"].encode("ascii", "replace"),
            key_pem=texts["client_key_pem"].encode("ascii", "replace"),
            chain_pem=texts["ca_chain_pem"].encode("ascii", "replace"),
            serial=texts["serial"],
            not_after=not_after,
            agent_fingerprint=texts["agent_fingerprint"],
            server_addr=texts["server_addr"],
            server_name=texts["server_name"],
            allocation_id=texts["allocation_id"],
        )
        creds.check()
        return creds

    def leaf(self) -> x509.Certificate:
        """The leaf certificate."""
        return cert_from_pem(self.leaf_pem)

    def key(self) -> Ed25519PrivateKey:
        """The leaf's private key."""
        return key_from_pem(self.key_pem)

    def intermediates_and_root(self) -> tuple[list[x509.Certificate], x509.Certificate]:
        """The chain split into the intermediates and the org root."""
        return split_ca_chain(certs_from_pem(self.chain_pem))

    def check(self) -> None:
        """
        @raise CredentialsError: the parts do not belong together (key not
            the leaf's, serial or fingerprint not the leaf's, chain not one
            intermediate then a root).
        """
        try:
            leaf = self.leaf()
            key = self.key()
            intermediates, _root = self.intermediates_and_root()
        except PKIError as e:
            raise CredentialsError(f"unreadable certificate or key: {e}") from None
        if leaf.public_key() != key.public_key():
            raise CredentialsError("the key does not belong to the leaf")
        if len(intermediates) != 1:
            raise CredentialsError("the CA chain is not one intermediate then the root")
        if names.format_serial(leaf.serial_number) != self.serial:
            raise CredentialsError("the serial is not the leaf's")
        if leaf_fingerprint(leaf) != self.agent_fingerprint:
            raise CredentialsError("the fingerprint is not the leaf's")

    def remaining(self, now: datetime) -> timedelta:
        """How long the leaf stays valid after C{now} (negative once expired)."""
        return self.not_after - now

    def client_tls(self) -> IOpenSSLClientConnectionCreator:
        """Mutual TLS 1.3 options to dial the data-plane server C{server_name}."""
        intermediates, root = self.intermediates_and_root()
        return client_tls_options(self.leaf(), self.key(), intermediates, root, self.server_name)

    def to_json(self) -> bytes:
        """The on-disk form (holds the private key)."""
        document = {
            "version": FILE_VERSION,
            "client_cert_pem": self.leaf_pem.decode("ascii"),
            "client_key_pem": self.key_pem.decode("ascii"),
            "ca_chain_pem": self.chain_pem.decode("ascii"),
            "expires_at": _format_time(self.not_after),
            **{name: getattr(self, name) for name in _TEXT_FIELDS},
        }
        return json.dumps(document, indent=2, sort_keys=True).encode("utf-8") + b"\n"


def save_credentials(directory: Path, creds: AgentCredentials) -> Path:
    """
    Store C{creds} as C{directory/agent-credentials.json} (mode 0600,
    atomic and durable), creating C{directory} (mode 0700) if needed. Blocks.
    """
    make_directories(directory)
    path = directory / CREDENTIALS_FILE
    write_file_atomically(path, creds.to_json(), mode=0o600)
    return path


def load_credentials(directory: Path) -> AgentCredentials | None:
    """
    The credentials L{save_credentials} stored in C{directory}, or L{None}
    when there are none. Whether the leaf is still live is the caller's
    decision (L{AgentCredentials.remaining}). Blocks.

    @raise CredentialsError: the file exists but is unreadable or
        inconsistent.
    """
    path = directory / CREDENTIALS_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        document = json.loads(raw)
    except ValueError:
        raise CredentialsError(f"{path} is not JSON") from None
    if not isinstance(document, dict) or document.get("version") != FILE_VERSION:
        raise CredentialsError(f"{path} is not a version {FILE_VERSION} credentials file")
    try:
        return AgentCredentials.from_enrollment(document)
    except CredentialsError as e:
        raise CredentialsError(f"{path}: {e}") from None
