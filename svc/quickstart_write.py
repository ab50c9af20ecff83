"""
The demo's data path: connect to the data plane with the enrolled agent's
certificate, write a file (content-defined chunks, only novel ones uploaded,
then a compare-and-swap manifest commit carrying the mount session), read it
back chunk by chunk and check every byte. Run by L{svc.quickstart}.

Usage: python -m svc.quickstart_write STATE_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from twisted.internet.task import react

from svc.chunking import chunk_bytes
from svc.dataplane_client.client import connect_dataplane
from svc.dataplane_client.errors import RemoteError
from svc.pki.pem import cert_from_pem, certs_from_pem, key_from_pem
from svc.pki.tls import client_tls_options
from svc.quickstart import DEMO_AGENT
from svc.wire.errno import WireErrno

GREETING = (
    "Hello from svc: this file was cut into content-defined chunks, each named by its\n"
    "BLAKE3 hash, uploaded over mutual TLS 1.3 and committed with a compare-and-swap.\n"
)


async def write_and_read(reactor: Any, root: Path) -> None:
    state = json.loads((root / "state.json").read_text())
    credentials = root / "agent"
    chain = certs_from_pem((credentials / "chain.pem").read_bytes())
    tls = client_tls_options(
        cert_from_pem((credentials / "leaf.pem").read_bytes()),
        key_from_pem((credentials / "key.pem").read_bytes()),
        chain[:-1],
        chain[-1],
        state["server_name"],
    )
    host, port = state["server_addr"].rsplit(":", 1)
    client = await connect_dataplane(reactor, (host, int(port)), tls)
    try:
        path = f"/{DEMO_AGENT}/hello.txt"
        data = (GREETING * 64).encode()
        refs = chunk_bytes(data)
        has = await client.call("chunk_has", {"hashes": [r.hash for r in refs]})
        flags: list[bool] = list(has.payload["present"])  # type: ignore[call-overload]
        for ref, present in zip(refs, flags, strict=True):
            if not present:
                await client.call(
                    "chunk_put",
                    {"hash": ref.hash, "session_id": state["session_id"]},
                    data[ref.offset : ref.end],
                )
        try:
            current = await client.call("head_file", {"path": path})
            version = int(current.payload["version"])  # type: ignore[call-overload]
        except RemoteError as error:
            if error.errno != WireErrno.ENOENT:
                raise
            version = 0
        put = await client.call(
            "manifest_put",
            {
                "path": path,
                "expected_version": version,
                "chunks": [[r.hash, r.length] for r in refs],
                "size": len(data),
                "mode": 0o644,
                "mtime_ns": time.time_ns(),
                "session_id": state["session_id"],
            },
        )
        print(f"    committed {path} version {put.payload['version']} ({len(data)} bytes)")
        manifest = await client.call("manifest_get", {"path": path})
        read_back = b""
        for chunk_hash, _size in manifest.payload["chunks"]:  # type: ignore[attr-defined]
            read_back += (await client.call("chunk_get", {"hash": chunk_hash})).raw
        if read_back != data:
            raise SystemExit("read-back mismatch: the data plane returned different bytes")
        listing = await client.call("list", {"path": f"/{DEMO_AGENT}"})
        names = [entry["name"] for entry in listing.payload["entries"]]  # type: ignore[attr-defined]
        print(f"    read back {len(read_back)} bytes, identical; /{DEMO_AGENT} holds {names}")
    finally:
        await client.close()


def main() -> None:
    root = Path(sys.argv[1])
    react(lambda reactor: write_and_read(reactor, root))


if __name__ == "__main__":
    main()
