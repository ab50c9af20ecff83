"""
System tests of the host SDK (L{svc.sdk}), run the way a host runs it: in a
separate interpreter started with C{-I -S} whose C{sys.path} holds only the
standard library and the checkout (so neither Twisted nor attrs can be
imported), against

  - a real C{twist svc-control} process on SQLite with a filesystem CA:
    every SDK call's happy path, and error answers with every field;
  - small standard-library stub servers in this process: a server of
    another API major, a 1 MiB error body, C{Retry-After}, a server that
    never answers, and HTTPS with a certificate from a test CA.

The SDK's calls are described as JSON on the child's stdin; the child prints
what each returned (or every field of the error it raised) as JSON.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.trial.unittest import TestCase

from tests.test_control_system import KEK, ControlProcess, free_port, operator

REPO = Path(__file__).resolve().parent.parent
TOKEN = "sdk-system-test-token-" + "q" * 20
MOUNT_PREFIX = "/srv/sdk-test"
REQUEST_ID = re.compile(r"[0-9a-f]{32}")

DRIVER = r"""
import dataclasses, importlib.util, json, sys, time

sys.path.insert(0, sys.argv[1])
import svc.sdk as sdk

isolation = {
    "foreign_modules": sorted(
        name for name in sys.modules
        if name.split(".")[0] not in sys.stdlib_module_names
        and name not in ("__main__", "svc") and not name.startswith("svc.sdk")
    ),
    "attrs": importlib.util.find_spec("attrs") is not None,
    "twisted.internet": importlib.util.find_spec("twisted.internet") is not None,
    "no_site": "site" not in sys.modules,
}

def plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)

def error_fields(error):
    return {
        "class": type(error).__name__,
        "is_svc_error": isinstance(error, sdk.SvcError),
        "kind": error.kind.value,
        "kind_is_not_found_sentinel": error.kind is sdk.NOT_FOUND,
        "is_not_found": error.is_not_found,
        "operation": error.operation,
        "method": error.method,
        "path": error.path,
        "status": error.status,
        "code": error.code,
        "message": error.message,
        "request_id": error.request_id,
        "headers": [list(pair) for pair in error.headers],
        "body": error.body.decode("latin-1"),
        "body_truncated": error.body_truncated,
        "server_version": getattr(error, "server_version", None),
        "is_retryable": sdk.is_retryable(error),
        "retry_after": sdk.retry_after(error),
        "retry_delay": sdk.retry_delay(error, 1, base=0.5, rng=lambda: 0.5),
        "text": str(error),
    }

results = []
for step in json.load(sys.stdin):
    client = sdk.Client(**step["client"])
    started = time.monotonic()
    try:
        value = getattr(client, step["call"])(*step.get("args", []), **step.get("kwargs", {}))
        result = {"ok": plain(value), "repr": repr(value)}
    except sdk.SvcError as error:
        result = {"error": error_fields(error)}
    result["elapsed"] = time.monotonic() - started
    results.append(result)
print(json.dumps({"isolation": isolation, "results": results}))
"""


def step(base_url: str, call: str, *args: Any, client: Any = None, **kwargs: Any) -> dict[str, Any]:
    """One SDK call for the driver: C{Client(base_url, ...).call(*args, **kwargs)}."""
    options = {"base_url": base_url, "service_token": TOKEN, "timeout": 10.0, **(client or {})}
    return {"client": options, "call": call, "args": list(args), "kwargs": kwargs}


def run_sdk(case: TestCase, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run C{steps} in an isolated stdlib-only interpreter; return each step's result."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", DRIVER, str(REPO)],
        input=json.dumps(steps),
        capture_output=True,
        text=True,
        env={},
        cwd="/",
        timeout=120,
        check=False,
    )
    case.assertEqual(done.returncode, 0, done.stderr)
    report = json.loads(done.stdout)
    isolation = report["isolation"]
    case.assertEqual(
        isolation,
        {"attrs": False, "twisted.internet": False, "no_site": True, "foreign_modules": []},
    )
    results: list[dict[str, Any]] = report["results"]
    return results


def ok(result: dict[str, Any]) -> Any:
    """The value of a step that must have succeeded."""
    if "ok" not in result:
        raise AssertionError(f"the call failed: {result['error']['text']}")
    return result["ok"]


def failure(result: dict[str, Any]) -> dict[str, Any]:
    """The error fields of a step that must have failed."""
    if "error" not in result:
        raise AssertionError(f"the call succeeded: {result['ok']}")
    fields: dict[str, Any] = result["error"]
    return fields


def header(fields: dict[str, Any], name: str) -> str | None:
    """A header of an error's fields, by case-insensitive name."""
    for key, value in fields["headers"]:
        if key.lower() == name.lower():
            found: str = value
            return found
    return None


class LiveControlPlaneTests(TestCase):
    """The SDK against a real control plane on SQLite with a filesystem CA."""

    def setUp(self) -> None:
        workdir = Path(self.mktemp()).resolve()
        (workdir / "secrets").mkdir(parents=True)
        environ = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{workdir}/control.db",
            "SVC_CONTROL_PLANE_TOKEN": TOKEN,
            "SVC_SECRETS_DIR": str(workdir / "secrets"),
            "SVC_CA_KEK": KEK,
            "SVC_TRUST_DOMAIN": "svc.test",
            "SVC_ORG_NAME": "SDK System Test",
            "SVC_MOUNT_PREFIX": MOUNT_PREFIX,
        }
        operator(environ, "ca", "init")
        self.control = ControlProcess(workdir, environ, tls=False)
        self.addCleanup(self.control.stop)
        self.control.start()
        self.url = self.control.url

    def test_every_call(self) -> None:
        """Provision, resolve, quota, budget, enroll token, usage, reassign and delete work."""
        url = self.url
        results = run_sdk(
            self,
            [
                step(url, "allocate_disk", "a1", "acme", 1 << 30),
                step(url, "allocate_disk", "a1", "acme", 1 << 30),
                step(url, "allocate_disk", "a2", "acme", 5, tenant_id="acme-lab"),
                step(url, "resolve", "agent", "a1"),
                step(url, "set_disk_quota", "a1", 2 << 30),
                step(url, "set_account_budget", "acme", 10 << 30),
                step(url, "resolve", "account", "acme"),
                step(url, "mint_enroll_token", "a1"),
                step(url, "usage", "acme"),
                step(url, "set_account_budget", "acme", None),
                step(url, "reassign", "a2", "globex"),
                step(url, "delete_entity", "agent", "a1"),
                step(url, "delete_entity", "agent", "a1"),
                step(url, "resolve", "agent", "a1"),
                step(url, "delete_entity", "account", "globex"),
                step(url, "resolve", "account", "globex"),
                step(url + "/api", "resolve", "account", "acme"),
            ],
        )
        first, again, other = (ok(r) for r in results[:3])
        self.assertEqual(
            {k: first[k] for k in ("type", "id", "owner", "tenant", "grant_bytes", "state")},
            {
                "type": "agent",
                "id": "a1",
                "owner": "acme",
                "tenant": "acme",
                "grant_bytes": 1 << 30,
                "state": "provisioned",
            },
        )
        self.assertEqual(first["virtual_path"], f"{MOUNT_PREFIX}/agents/a1")
        self.assertEqual((first["created"], again["created"]), (True, False))
        self.assertEqual(again["allocation_id"], first["allocation_id"])
        self.assertRegex(first["allocation_id"], "^[0-9a-f]{32}$")
        self.assertEqual(other["tenant"], "acme-lab")
        resolved = ok(results[3])
        self.assertEqual((resolved["id"], resolved["created"]), ("a1", None))
        self.assertEqual(ok(results[4])["grant_bytes"], 2 << 30)
        self.assertEqual(ok(results[5]), {"id": "acme", "budget_bytes": 10 << 30})
        account = ok(results[6])
        self.assertEqual(
            (account["type"], account["id"], account["budget_bytes"], account["suspended"]),
            ("account", "acme", 10 << 30, False),
        )
        self.assertEqual([a["agent_id"] for a in account["allocations"]], ["a1", "a2"])
        minted = ok(results[7])
        self.assertEqual(len(minted["token"]), 43)
        self.assertEqual(
            (minted["agent_id"], minted["allocation_id"]), ("a1", first["allocation_id"])
        )
        self.assertNotIn(minted["token"], results[7]["repr"])
        usage = ok(results[8])
        self.assertEqual((usage["owner"], usage["used_bytes"]), ("acme", 0))
        self.assertEqual(usage["budget_bytes"], 10 << 30)
        self.assertEqual(
            usage["agents"]["a1"], {"used_bytes": 0, "grant_bytes": 2 << 30, "state": "provisioned"}
        )
        self.assertEqual(ok(results[9]), {"id": "acme", "budget_bytes": None})
        moved = ok(results[10])
        self.assertEqual((moved["id"], moved["owner"], moved["tenant"]), ("a2", "globex", "globex"))
        self.assertEqual((ok(results[11]), ok(results[12])), (None, None))
        revoked = failure(results[13])
        self.assertEqual((revoked["status"], revoked["code"]), (410, "revoked"))
        self.assertEqual((revoked["kind"], revoked["is_not_found"]), ("gone", False))
        self.assertIsNone(ok(results[14]))
        suspended = ok(results[15])
        self.assertTrue(suspended["suspended"])
        self.assertEqual([a["state"] for a in suspended["allocations"]], ["revoked"])
        via_prefix = ok(results[16])
        self.assertEqual((via_prefix["type"], via_prefix["id"]), ("account", "acme"))

    def test_error_fields(self) -> None:
        """A 404 carries every field and the not-found sentinel; 400, 401, 409 and no answer too."""
        url = self.url
        results = run_sdk(
            self,
            [
                step(url, "resolve", "agent", "nobody"),
                step(url, "usage", "acme", client={"service_token": "not-the-token"}),
                step(url, "allocate_disk", "a1", "acme", 1),
                step(url, "allocate_disk", "a1", "acme", 2),
                step(url, "resolve", "agent", ".."),
                step(url, "mint_enroll_token", "x y/z"),
                step(f"http://127.0.0.1:{free_port()}", "usage", "acme"),
            ],
        )
        missing = failure(results[0])
        self.assertEqual(
            {k: missing[k] for k in ("class", "operation", "method", "path", "status", "code")},
            {
                "class": "SvcError",
                "operation": "resolve",
                "method": "GET",
                "path": "/v1/entities/agent/nobody",
                "status": 404,
                "code": "not_found",
            },
        )
        body = json.loads(missing["body"])
        self.assertEqual(body["error"], "not_found")
        self.assertTrue(missing["message"])
        self.assertEqual(missing["message"], body["error_description"])
        self.assertFalse(missing["body_truncated"])
        self.assertTrue(missing["kind_is_not_found_sentinel"])
        self.assertTrue(missing["is_not_found"])
        self.assertRegex(missing["request_id"], REQUEST_ID)
        self.assertEqual(header(missing, "X-Request-ID"), missing["request_id"])
        self.assertEqual(header(missing, "Svc-API-Version"), "1")
        self.assertEqual(header(missing, "Content-Type"), "application/json")
        self.assertFalse(missing["is_retryable"])

        denied = failure(results[1])
        self.assertEqual((denied["status"], denied["code"]), (401, "invalid_token"))
        self.assertEqual((denied["kind"], denied["operation"]), ("unauthenticated", "usage"))
        self.assertEqual(header(denied, "WWW-Authenticate"), "Bearer")
        self.assertNotIn(TOKEN, denied["text"])

        ok(results[2])
        conflict = failure(results[3])
        self.assertEqual((conflict["status"], conflict["code"]), (409, "grant_mismatch"))
        self.assertEqual((conflict["method"], conflict["path"]), ("POST", "/v1/entities"))

        dots = failure(results[4])
        self.assertEqual(dots["path"], "/v1/entities/agent/%2E%2E")
        self.assertEqual((dots["status"], dots["kind"]), (400, "invalid_request"))
        self.assertEqual((dots["code"], dots["message"]), ("invalid_request", "invalid_agent_id"))
        self.assertEqual(failure(results[5])["path"], "/v1/agents/x%20y%2Fz/enroll-token")

        refused = failure(results[6])
        self.assertEqual(
            (refused["class"], refused["kind"], refused["status"], refused["code"]),
            ("TransportError", "transport", None, None),
        )
        self.assertRegex(refused["request_id"], REQUEST_ID)
        self.assertTrue(refused["is_retryable"])
        self.assertEqual((refused["headers"], refused["body"]), ([], ""))


class StubServer:
    """
    A standard-library HTTP(S) server answering each path with a canned
    status, headers and body, and recording the requests it got.
    """

    def __init__(self, case: TestCase, context: Any = None) -> None:
        self.answers: dict[str, tuple[int, dict[str, str], bytes]] = {}
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                stub.requests.append((self.command, self.path, dict(self.headers), body))
                status, headers, answer = stub.answers.get(self.path, (404, {}, b""))
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # the client stopped reading (the bounded error body)

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if context is not None:
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port: int = self.server.server_address[1]
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        case.addCleanup(self.server.server_close)
        case.addCleanup(self.server.shutdown)

    def answer(self, path: str, status: int, body: bytes, **headers: str) -> None:
        self.answers[path] = (status, {k.replace("_", "-"): v for k, v in headers.items()}, body)


USAGE = json.dumps({"owner": "acme", "used_bytes": 3, "budget_bytes": None, "agents": {}}).encode()


class StubServerTests(TestCase):
    """The SDK against stub servers that misbehave in chosen ways."""

    def setUp(self) -> None:
        self.stub = StubServer(self)
        self.url = f"http://127.0.0.1:{self.stub.port}"

    def test_request_headers(self) -> None:
        """Every request carries the Bearer token, Svc-API-Version: 1, a request id; JSON bodies."""
        self.stub.answer("/v1/tenants/acme/usage", 200, USAGE, Svc_API_Version="1")
        results = run_sdk(
            self,
            [
                step(self.url, "usage", "acme"),
                step(self.url, "set_disk_quota", "a/1", 5),
            ],
        )
        self.assertEqual(ok(results[0])["used_bytes"], 3)
        (method, path, headers, body), (method2, path2, headers2, body2) = self.stub.requests
        self.assertEqual((method, path, body), ("GET", "/v1/tenants/acme/usage", b""))
        self.assertEqual(headers["Authorization"], f"Bearer {TOKEN}")
        self.assertEqual(headers["Svc-API-Version"], "1")
        self.assertRegex(headers["X-Request-ID"], REQUEST_ID)
        self.assertTrue(headers["User-Agent"].startswith("svc-sdk-python/"))
        self.assertEqual((method2, path2), ("PATCH", "/v1/entities/agent/a%2F1"))
        self.assertEqual(headers2["Content-Type"], "application/json")
        self.assertEqual(json.loads(body2), {"grant_bytes": 5})
        self.assertNotEqual(headers2["X-Request-ID"], headers["X-Request-ID"])
        self.assertEqual(failure(results[1])["request_id"], headers2["X-Request-ID"])

    def test_version_skew(self) -> None:
        """Another major is a VersionSkewError, success or not; a missing header is compatible."""
        self.stub.answer("/v1/tenants/two/usage", 200, USAGE, Svc_API_Version="2")
        self.stub.answer(
            "/v1/tenants/gone/usage", 404, b'{"error":"not_found"}', Svc_API_Version="2"
        )
        self.stub.answer("/v1/tenants/old/usage", 200, USAGE)
        self.stub.answer("/v1/tenants/minor/usage", 200, USAGE, Svc_API_Version="1.7")
        results = run_sdk(
            self,
            [
                step(self.url, "usage", "two"),
                step(self.url, "usage", "gone"),
                step(self.url, "usage", "old"),
                step(self.url, "usage", "minor"),
            ],
        )
        skew = failure(results[0])
        self.assertEqual(
            (skew["class"], skew["is_svc_error"], skew["kind"], skew["server_version"]),
            ("VersionSkewError", True, "version_skew", "2"),
        )
        self.assertEqual((skew["status"], skew["operation"]), (200, "usage"))
        self.assertFalse(skew["is_retryable"])
        self.assertEqual(failure(results[1])["kind"], "version_skew")
        self.assertEqual(ok(results[2])["owner"], "acme")
        self.assertEqual(ok(results[3])["owner"], "acme")

    def test_error_body_bounded(self) -> None:
        """A 1 MiB error body is kept to its first 64 KiB and marked truncated."""
        self.stub.answer("/v1/tenants/big/usage", 500, b"E" * (1 << 20), Svc_API_Version="1")
        self.stub.answer("/v1/tenants/edge/usage", 502, b"e" * (64 * 1024), Svc_API_Version="1")
        big, edge = run_sdk(self, [step(self.url, "usage", "big"), step(self.url, "usage", "edge")])
        cut = failure(big)
        self.assertEqual((len(cut["body"]), cut["body_truncated"]), (64 * 1024, True))
        self.assertEqual((cut["status"], cut["code"], cut["kind"]), (500, None, "server_error"))
        whole = failure(edge)
        self.assertEqual((len(whole["body"]), whole["body_truncated"]), (64 * 1024, False))

    def test_retry_after(self) -> None:
        """Retry-After (seconds or HTTP-date) sets retry_delay's floor; the SDK does not retry."""
        later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
        self.stub.answer(
            "/v1/tenants/busy/usage",
            503,
            b'{"error":"temporarily_unavailable"}',
            Retry_After="7",
        )
        self.stub.answer(
            "/v1/tenants/limited/usage", 429, b'{"error":"rate_limited"}', Retry_After=later
        )
        self.stub.answer("/v1/tenants/plain/usage", 504, b"")
        busy, limited, plain = run_sdk(
            self,
            [
                step(self.url, "usage", "busy"),
                step(self.url, "usage", "limited"),
                step(self.url, "usage", "plain"),
            ],
        )
        self.assertEqual(len(self.stub.requests), 3)
        first = failure(busy)
        self.assertEqual((first["kind"], first["is_retryable"]), ("unavailable", True))
        self.assertEqual(first["retry_after"], 7.0)
        self.assertEqual(first["retry_delay"], 7.0 + 0.5 * 0.5)
        dated = failure(limited)
        self.assertEqual((dated["kind"], dated["is_retryable"]), ("rate_limited", True))
        self.assertGreater(dated["retry_after"], 100)
        self.assertGreaterEqual(dated["retry_delay"], dated["retry_after"])
        bare = failure(plain)
        self.assertEqual((bare["retry_after"], bare["retry_delay"]), (None, 0.25 + 0.5 * 0.25))

    def test_timeout(self) -> None:
        """A server that accepts the connection but never answers gives a RequestTimeout."""
        silent = socket.socket()
        self.addCleanup(silent.close)
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # never accepted: the kernel completes the handshake
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        (result,) = run_sdk(self, [step(url, "usage", "acme", client={"timeout": 0.5})])
        timeout = failure(result)
        self.assertEqual(
            (timeout["class"], timeout["kind"], timeout["status"]),
            ("RequestTimeout", "timeout", None),
        )
        self.assertTrue(timeout["is_retryable"])
        self.assertLess(result["elapsed"], 10)
        self.assertLess(time.monotonic() - started, 60)


class CustomCATests(TestCase):
    """HTTPS to a server whose certificate comes from a test CA."""

    def setUp(self) -> None:
        import ssl  # noqa: PLC0415

        workdir = Path(self.mktemp()).resolve()
        workdir.mkdir(parents=True)
        ca_key, ca_cert = self.make_ca("SDK Test CA")
        _, other_ca = self.make_ca("Some Other CA")
        server_key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        server_cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_cert.subject)
            .public_key(server_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(IPv4Address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        self.ca_file = workdir / "ca.pem"
        self.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        self.other_ca_file = workdir / "other-ca.pem"
        self.other_ca_file.write_bytes(other_ca.public_bytes(serialization.Encoding.PEM))
        cert_file, key_file = workdir / "server.pem", workdir / "server-key.pem"
        cert_file.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            server_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        self.stub = StubServer(self, context)
        self.stub.answer("/v1/tenants/acme/usage", 200, USAGE, Svc_API_Version="1")

    @staticmethod
    def make_ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.now(UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return key, cert

    def test_ca_file_trusted_and_required(self) -> None:
        """With the test CA the call succeeds; with the system store or another CA it fails."""
        url = f"https://localhost:{self.stub.port}"
        trusted, system, other = run_sdk(
            self,
            [
                step(url, "usage", "acme", client={"ca_file": str(self.ca_file)}),
                step(url, "usage", "acme"),
                step(url, "usage", "acme", client={"ca_file": str(self.other_ca_file)}),
            ],
        )
        self.assertEqual(ok(trusted)["used_bytes"], 3)
        for result in (system, other):
            refused = failure(result)
            self.assertEqual(
                (refused["class"], refused["kind"], refused["status"]),
                ("TransportError", "transport", None),
            )
            self.assertIn("CERTIFICATE_VERIFY_FAILED", refused["message"])
        self.assertEqual(len(self.stub.requests), 1)
