"""
The control plane's C{GET /readyz} on a real C{twist svc-control} process,
configured the way the deployment files do it: every secret from a file
(C{SVC_CONTROL_PLANE_TOKEN_FILE}, C{SVC_CA_KEK_FILE}, C{DATABASE_URL_FILE}),
the operator command C{svc ca init} reading the same files.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from twisted.trial.unittest import TestCase

from tests.test_control_system import KEK, PUSH_INTERVAL, TOKEN, ControlProcess, call, operator


class ReadinessProcessTests(TestCase):
    """A fresh control plane becomes ready once its CA exists."""

    def setUp(self) -> None:
        self.workdir = Path(self.mktemp()).resolve()
        secrets = self.workdir / "secrets"
        secrets.mkdir(parents=True)
        credentials = self.workdir / "credentials"
        credentials.mkdir(mode=0o700)
        files = {
            "SVC_CONTROL_PLANE_TOKEN_FILE": ("token", TOKEN),
            "SVC_CA_KEK_FILE": ("kek", KEK),
            "DATABASE_URL_FILE": ("database-url", f"sqlite://{self.workdir / 'control.db'}"),
        }
        self.environ = {
            k: v
            for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "SVC_CONTROL_PLANE_TOKEN", "SVC_CA_KEK")
        }
        for variable, (name, value) in files.items():
            path = credentials / name
            path.write_text(value + "\n")
            path.chmod(0o600)
            self.environ[variable] = str(path)
        self.environ.update(
            {
                "SVC_SECRETS_DIR": str(secrets),
                "SVC_TRUST_DOMAIN": "svc.test",
                "SVC_REVOCATION_PUSH_INTERVAL_SECONDS": str(PUSH_INTERVAL),
            }
        )
        self.control = ControlProcess(self.workdir, self.environ, tls=False)
        self.addCleanup(self.control.stop)

    def readyz(self) -> tuple[int, dict[str, object]]:
        status, body, headers = call("GET", self.control.url + "/readyz", token=None)
        lowered = {name.lower(): value for name, value in headers.items()}
        self.assertEqual(lowered.get("svc-api-version"), "1")
        return status, body

    def test_not_ready_until_ca_init(self) -> None:
        """503 naming agent_ca before svc ca init; 200 within a push round after it."""
        self.control.start()
        status, body = self.readyz()
        self.assertEqual(status, 503, body)
        self.assertEqual(
            body["checks"],
            {"database": "ok", "agent_ca": "not_initialised", "dataplane": "none_registered"},
        )
        # The service token was read from its file: a service-token route accepts it.
        self.assertEqual(call("GET", self.control.url + "/v1/entities/agent/nobody")[0], 404)
        operator(self.environ, "ca", "init")
        deadline = time.monotonic() + 4 * PUSH_INTERVAL
        while (answer := self.readyz())[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(
            answer,
            (
                200,
                {
                    "status": "ready",
                    "checks": {"database": "ok", "agent_ca": "ok", "dataplane": "none_registered"},
                },
            ),
        )
