"""
The owner dashboard in a real browser against a real stack.

A real C{twist svc-control} (SQLite) and C{twist svc-dataplane} run as
subprocesses (the quickstart's L{Stack}, without its FUSE mount); the demo
agent is provisioned, enrolled and holds its mount lease; C{svc user seed}
prints the owner's sign-in link. Debian's headless C{chromium} is driven by
Selenium through C{/usr/bin/chromedriver} (given explicitly, so
selenium-manager never downloads anything).

The browser talks to the control plane over HTTPS only, on its own
C{--tls-listen} listener as the operator guide recommends (the certificate
the org root issues at start, an ECDSA P-256 leaf for C{localhost}), without
C{SVC_DEV_MODE}, so the session cookie is C{Secure}. The test checks that
the served certificate verifies against the org root for C{localhost} and is
ECDSA P-256, then tells chromium to accept exactly that key
(C{--ignore-certificate-errors-spki-list}): chromium cannot verify the org
root's Ed25519 signature, but the handshake is real and would fail with
C{ERR_SSL_VERSION_OR_CIPHER_MISMATCH} on an Ed25519 leaf.

The scenario follows the spec's acceptance flow: sign in through
C{/admin/session?token=…}; see the allocation's usage and mount; create an
API token (secret shown once) and revoke it; write a file through the data
plane and watch its journal entry arrive live; revert it from the page; read
the file back through the data plane and find the previous bytes; force the
unmount; log out. A screenshot is saved at each step into
C{$SVC_TEST_ARTIFACTS}, else C{build/test-artifacts/dashboard/}.

Without chromium, chromedriver or selenium the test is skipped, except under
C{CI=true}, where that is a failure.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from twisted.internet import reactor
from twisted.trial.unittest import SkipTest, TestCase

from svc.chunking import chunk_bytes
from svc.dataplane_client.client import DataPlaneClient, connect_dataplane
from svc.dataplane_client.errors import RemoteError
from svc.pki.pem import cert_from_pem, certs_from_pem, key_from_pem
from svc.pki.tls import client_tls_options
from svc.quickstart import (
    DEMO_AGENT,
    DEMO_OWNER,
    enroll_and_mount,
    http,
    start_dataplane,
    wait_until,
)
from svc.quickstart_stack import Stack
from svc.wire.errno import WireErrno
from tests.json_logs import JSON_LOGS, check_json_log, stack_logs

try:
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover - reported by _missing()
    webdriver = None  # type: ignore[assignment]

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_SECONDS = 60
"""Generous: the page waits on real processes (usage asks the data plane)."""

FILE_PATH = f"/{DEMO_AGENT}/notes.txt"
BEFORE = os.urandom(40_000) + b"\nthe first version\n"
AFTER = os.urandom(50_000) + b"\nthe second version, to be reverted\n"
TOKEN_NAME = "ci-browser"
SHOT_PREFIX = "dashboard-"


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _missing() -> str | None:
    """What this machine lacks to run the browser test, or None."""
    if webdriver is None:
        return "selenium is not installed (pip install -e '.[test]')"
    for program, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(program, os.X_OK):
            return f"{program} is missing (apt-get install {package})"
    return None


def artifacts_dir() -> Path:
    """
    Where screenshots go: C{$SVC_TEST_ARTIFACTS}, else
    build/test-artifacts/dashboard; emptied of this test's earlier screenshots.
    """
    configured = os.environ.get("SVC_TEST_ARTIFACTS")
    directory = Path(configured) if configured else REPO / "build" / "test-artifacts" / "dashboard"
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(SHOT_PREFIX + "*.png"):
        stale.unlink()
    return directory


def served_certificate(port: int, org_root: Path) -> x509.Certificate:
    """
    The certificate the HTTPS listener on C{port} serves, after a handshake
    that verified it against C{org_root} for the name C{localhost}.
    """
    context = ssl.create_default_context(cafile=str(org_root))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def spki_pin(certificate: x509.Certificate) -> str:
    """The base64 SHA-256 of C{certificate}'s public key, as chromium's pin list takes it."""
    spki = certificate.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode("ascii")


def start_browser(profile: Path, pinned: str) -> WebDriver:
    """
    Headless chromium with a throw-away profile, no background networking,
    accepting the server key C{pinned} (an L{spki_pin}) only.
    """
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # tests run as root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1600",
        f"--user-data-dir={profile}",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        f"--ignore-certificate-errors-spki-list={pinned}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


class AgentFiles:
    """The enrolled demo agent's data-plane access, one connection per operation."""

    def __init__(self, root: Path, state: dict[str, Any]) -> None:
        credentials = root / "agent"
        chain = certs_from_pem((credentials / "chain.pem").read_bytes())
        self._tls = client_tls_options(
            cert_from_pem((credentials / "leaf.pem").read_bytes()),
            key_from_pem((credentials / "key.pem").read_bytes()),
            chain[:-1],
            chain[-1],
            state["server_name"],
        )
        host, port = state["server_addr"].rsplit(":", 1)
        self._address = (host, int(port))
        self._session = state["session_id"]

    async def _connect(self) -> DataPlaneClient:
        return await connect_dataplane(reactor, self._address, self._tls)

    async def write(self, path: str, data: bytes) -> int:
        """Upload the novel chunks and commit C{data} at C{path}; the new version."""
        client = await self._connect()
        try:
            refs = chunk_bytes(data)
            has = await client.call("chunk_has", {"hashes": [r.hash for r in refs]})
            present: list[bool] = list(has.payload["present"])  # type: ignore[call-overload]
            for ref, there in zip(refs, present, strict=True):
                if not there:
                    await client.call(
                        "chunk_put",
                        {"hash": ref.hash, "session_id": self._session},
                        data[ref.offset : ref.end],
                    )
            try:
                head = await client.call("head_file", {"path": path})
                version = int(head.payload["version"])  # type: ignore[call-overload]
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
                    "session_id": self._session,
                },
            )
            return int(put.payload["version"])  # type: ignore[call-overload]
        finally:
            await client.close()

    async def read(self, path: str) -> bytes:
        """The bytes at C{path}, chunk by chunk."""
        client = await self._connect()
        try:
            manifest = await client.call("manifest_get", {"path": path})
            data = b""
            for chunk_hash, _size in manifest.payload["chunks"]:  # type: ignore[attr-defined]
                data += (await client.call("chunk_get", {"hash": chunk_hash})).raw
            return data
        finally:
            await client.close()


class DashboardBrowserTests(TestCase):
    """
    The acceptance flow of the owner dashboard in headless chromium.
    """

    timeout = 600

    def setUp(self) -> None:
        missing = _missing()
        if missing is not None:
            if os.environ.get("CI") == "true":
                self.fail(f"{missing}; the dashboard browser test must run under CI=true")
            raise SkipTest(missing)
        self.work = Path(self.mktemp()).resolve()
        self.work.mkdir(parents=True)
        self.artifacts = artifacts_dir()
        self.shots: list[Path] = []
        self.control_url, self.state, self.environ = self._start_stack()
        self.files = AgentFiles(self.stack.root, self.state)
        org_root = self.stack.root / "secrets" / "ca" / "root" / "cert.pem"
        self.served = served_certificate(self.tls_port, org_root)
        self.browser = start_browser(self.work / "chromium-profile", spki_pin(self.served))
        self.addCleanup(self.browser.quit)

    # The stack

    def _start_stack(self) -> tuple[str, dict[str, Any], dict[str, str]]:
        self.stack = stack = Stack(self.work / "stack")
        stack.root.mkdir(parents=True)
        self.addCleanup(check_json_log, stack_logs(stack.root))
        self.addCleanup(stack.stop)
        state = stack.first_time_state()
        stack.save_state(state)
        environ = {
            **stack.control_environ(state),
            **JSON_LOGS,
            # The lease taken at enrollment must outlive the test.
            "SVC_MOUNT_LEASE_TTL_SECONDS": "3600",
            "SVC_CONTROL_FQDN": "localhost",
        }
        # HTTPS for the browser: the session cookie is Secure, as in production.
        environ.pop("SVC_DEV_MODE", None)
        (stack.root / "secrets").mkdir(mode=0o700)
        self.svc(environ, "ca", "init")
        self.tls_port = free_port()
        self.browser_url = f"https://localhost:{self.tls_port}"
        try:
            control_url = self._start_control(stack, state, environ)
            start_dataplane(stack, state, JSON_LOGS)
            enroll_and_mount(stack, state, control_url)
        except SystemExit as stop:  # the quickstart's way of failing
            self.fail(f"{stop}; logs in {stack.root}")
        return control_url, state, environ

    def _start_control(self, stack: Stack, state: dict[str, Any], environ: dict[str, str]) -> str:
        """
        The control plane with the quickstart's plain listener (for the data
        plane and the SDK) and an HTTPS one for the browser; its plain URL.
        """
        control_url = f"http://127.0.0.1:{state['control_port']}"
        stack.spawn(
            "control",
            [
                stack._bin("twist"),
                "svc-control",
                "--listen",
                f"tcp:{state['control_port']}:interface=127.0.0.1",
                "--tls-listen",
                f"tcp:{self.tls_port}:interface=127.0.0.1",
            ],
            environ,
        )
        wait_until("the control plane", lambda: http("GET", control_url + "/healthz")[0] == 200)
        return control_url

    def svc(self, environ: dict[str, str], *argv: str) -> str:
        """Run the C{svc} operator command; its standard output."""
        done = subprocess.run(
            [self.stack._bin("svc"), *argv],
            env=environ,
            cwd=self.stack.root,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        return done.stdout

    def sign_in_link(self) -> str:
        """A fresh admin-session link for the demo owner (C{svc user seed})."""
        token = self.svc(self.environ, "user", "seed", "--user", DEMO_OWNER, "--name", "Demo Owner")
        return f"{self.browser_url}/admin/session?token={token.strip()}"

    def api_token_status(self, token: str) -> int:
        """The status of C{GET /me} with C{token} as the bearer credential."""
        status, _ = http("GET", self.control_url + "/me", None, token)
        return status

    # The browser

    def wait(self, condition: Any, what: str) -> Any:
        """Wait for C{condition} on the DOM, failing with C{what} and a screenshot."""
        try:
            return WebDriverWait(self.browser, WAIT_SECONDS, poll_frequency=0.2).until(condition)
        except TimeoutException:
            self.screenshot(f"timeout-{what.replace(' ', '-')}")
            text = self.browser.find_element(By.TAG_NAME, "body").text[:1000]
            self.fail(
                f"timed out after {WAIT_SECONDS}s waiting for {what} at"
                f" {self.browser.current_url}; the page says:\n{text}\n(logs in {self.stack.root})"
            )

    def visible(self, css: str, what: str) -> WebElement:
        element: WebElement = self.wait(
            expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, css)), what
        )
        return element

    def present(self, css: str, what: str) -> WebElement:
        element: WebElement = self.wait(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css)), what
        )
        return element

    def accept_confirm(self) -> str:
        """Accept the confirm() dialog the last click opened; its question."""
        alert = self.wait(expected_conditions.alert_is_present(), "the confirm dialog")
        question: str = alert.text
        alert.accept()
        return question

    def screenshot(self, name: str) -> Path:
        """Save the page as C{dashboard-NN-name.png} in the artifacts directory; print the path."""
        path = self.artifacts / f"{SHOT_PREFIX}{len(self.shots) + 1:02d}-{name}.png"
        self.browser.save_screenshot(str(path))
        self.shots.append(path)
        print(f"screenshot: {path}")
        return path

    def page_problems(self) -> list[str]:
        """Console messages about CSP violations or uncaught script errors."""
        entries = self.browser.get_log("browser")
        return [
            entry["message"]
            for entry in entries
            if "Content Security Policy" in entry["message"] or "Uncaught" in entry["message"]
        ]

    # The scenario

    async def test_owner_flow(self) -> None:
        """Sign in, usage, token once, live journal, revert restores bytes, unmount, logout."""
        version = await self.files.write(FILE_PATH, BEFORE)
        self.assertEqual(version, 1)
        browser = self.browser

        # 0. The HTTPS certificate is one browsers take: ECDSA P-256.
        key = self.served.public_key()
        self.assertIsInstance(key, ec.EllipticCurvePublicKey)
        assert isinstance(key, ec.EllipticCurvePublicKey)
        self.assertIsInstance(key.curve, ec.SECP256R1)

        # 1. Sign in with the link over HTTPS: a Secure cookie, then the dashboard.
        browser.get(self.sign_in_link())
        self.present('body[data-state="signed-in"]', "the signed-in page")
        self.assertEqual(browser.current_url, self.browser_url + "/dashboard")
        [cookie] = [c for c in browser.get_cookies() if c["name"] == "svc_admin_session"]
        self.assertTrue(cookie["secure"] and cookie["httpOnly"], cookie)
        self.assertEqual(browser.find_element(By.ID, "me-user").text, DEMO_OWNER)
        self.assertEqual(browser.find_element(By.ID, "me-name").text, "Demo Owner")
        self.screenshot("signed-in")

        # 2. The allocation with its usage against the quota, and the live mount.
        allocation = (
            f'[data-testid="allocation"][data-allocation-id="{self.state["allocation_id"]}"]'
        )
        card = self.present(allocation + "[data-used-bytes]", "the allocation's usage")
        self.assertEqual(int(str(card.get_attribute("data-used-bytes"))), len(BEFORE))
        usage = card.find_element(By.CSS_SELECTOR, '[data-testid="usage-text"]').text
        self.assertIn("of 1.00 GiB used", usage)
        bar = card.find_element(By.CSS_SELECTOR, '[data-testid="usage-bar"]')
        self.assertNotEqual(bar.value_of_css_property("width"), "0px")
        mount = card.find_element(By.CSS_SELECTOR, '[data-testid="mount-status"]')
        self.assertEqual(mount.get_attribute("data-mount"), "live")
        self.assertIn(f"held by {DEMO_AGENT}", mount.text)
        self.screenshot("allocation-usage")

        # 3. An API token: the secret is shown once, works, then is revoked.
        browser.find_element(By.ID, "token-name").send_keys(TOKEN_NAME)
        browser.find_element(By.ID, "token-create").click()
        self.visible("#token-secret-box", "the new token's secret")
        secret = str(browser.find_element(By.ID, "token-secret").get_attribute("value"))
        self.assertTrue(secret.startswith("svc_") and len(secret) == 47, secret[:8])
        row_css = f'[data-testid="token"][data-token-name="{TOKEN_NAME}"]'
        self.present(row_css + '[data-revoked="false"]', "the new token in the list")
        self.screenshot("token-created")
        self.assertEqual(self.api_token_status(secret), 200)
        browser.find_element(By.ID, "token-secret-dismiss").click()
        self.assertNotIn(secret, browser.page_source)
        browser.find_element(By.CSS_SELECTOR, row_css + ' [data-testid="token-revoke"]').click()
        self.assertIn(TOKEN_NAME, self.accept_confirm())
        self.present(row_css + '[data-revoked="true"]', "the token shown revoked")
        self.screenshot("token-revoked")
        self.assertEqual(self.api_token_status(secret), 401)

        # 4. The journal: history first, then a write shows up live.
        self.present('#journal-status[data-live="true"]', "the live journal stream")
        first = self.present(
            f'[data-testid="journal-entry"][data-path="{FILE_PATH}"]', "the first write in history"
        )
        first_seq = int(str(first.get_attribute("data-seq")))
        await self.files.write(FILE_PATH, AFTER)
        newer = (
            f'[data-testid="journal-entry"][data-path="{FILE_PATH}"]:not([data-seq="{first_seq}"])'
        )
        entry = self.present(newer, "the second write, live")
        seq = int(str(entry.get_attribute("data-seq")))
        self.assertGreater(seq, first_seq)
        top = browser.find_element(By.CSS_SELECTOR, '#journal > [data-testid="journal-entry"]')
        self.assertEqual(top.get_attribute("data-seq"), str(seq))
        self.screenshot("journal-live")

        # 5. Revert that write from the page.
        entry.find_element(By.CSS_SELECTOR, '[data-testid="journal-revert"]').click()
        self.assertIn(FILE_PATH, self.accept_confirm())
        result = self.visible('#revert-result[data-outcome="ok"]', "the revert's result")
        self.assertIn(f"#{seq}", result.text)
        self.present(
            f'[data-testid="journal-entry"][data-agent="owner:{DEMO_OWNER}"]',
            "the revert's own journal entry, live",
        )
        self.screenshot("reverted")

        # 6. The data plane serves the previous bytes again.
        self.assertEqual(await self.files.read(FILE_PATH), BEFORE)

        # 7. Force the unmount.
        browser.find_element(By.CSS_SELECTOR, allocation + ' [data-testid="force-unmount"]').click()
        self.accept_confirm()
        self.present(
            allocation + ' [data-testid="mount-status"][data-mount="none"]', "no mount any more"
        )
        self.screenshot("unmounted")

        # 8. Log out: the page says so, and stays signed out on reload.
        browser.find_element(By.ID, "logout").click()
        self.visible('[data-testid="signed-out"]', "the signed-out notice")
        self.screenshot("signed-out")
        browser.refresh()
        notice = self.visible('[data-testid="signed-out"]', "signed out after reload")
        self.assertIn("svc user seed", notice.text)

        self.assertEqual(self.page_problems(), [])
        self.assertEqual(len(self.shots), 8)
        for shot in self.shots:
            self.assertTrue(shot.stat().st_size > 0, shot)
