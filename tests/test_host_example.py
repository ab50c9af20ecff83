"""
The complete example of the host integration guide
(``docs/guides/host-integration.md`` section 7), run as written, twice in a
row, against the quickstart stack whose control plane is restarted with an
HTTPS listener (``--tls-listen``) as the guide's set-up has it; and the
``svc`` fleet commands against the same real stack.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from typing import Any

from svc.mount.runtime.mount_point import FSTYPE, fstypes_at
from svc.quickstart_stack import Stack
from svc.sdk import Client
from tests.dataplane_harness import free_ports
from tests.json_logs import JSON_LOGS, check_json_log
from tests.mount_harness import BIN, ROOT, MountStackCase

GUIDE = ROOT / "docs" / "guides" / "host-integration.md"


def guide_example() -> str:
    """The Python script of section 7 of the guide."""
    text = GUIDE.read_text()
    section = text[text.index("## 7. A complete example") :]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


class HostExampleTests(MountStackCase):
    """The guide's example and the fleet commands, over HTTPS."""

    def setUp(self) -> None:
        super().setUp()
        self.stack_files = Stack(self.stack)
        self.org_root = self.stack / "secrets" / "ca" / "root" / "cert.pem"
        self._restart_control_with_tls()

    def _restart_control_with_tls(self) -> None:
        stack, state = self.stack_files, self.state
        pid = stack.running("control")
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while stack.running("control") is not None:
            self.assertLess(time.monotonic(), deadline, "the control plane did not stop")
            time.sleep(0.1)
        [tls_port] = free_ports(1)
        stack.spawn(
            "control",
            [
                str(BIN / "twist"),
                "svc-control",
                "--listen",
                f"tcp:{state['control_port']}:interface=127.0.0.1",
                "--tls-listen",
                f"tcp:{tls_port}:interface=127.0.0.1",
            ],
            {**stack.control_environ(state), **JSON_LOGS},
        )
        self.https_url = f"https://localhost:{tls_port}"
        context = ssl.create_default_context(cafile=str(self.org_root))
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(
                    self.https_url + "/healthz", timeout=2, context=context
                ) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            self.assertLess(time.monotonic(), deadline, (self.stack / "control.log").read_text())
            time.sleep(0.2)

    def environ(self) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "SVC_CONTROL_URL": self.https_url,
            "SVC_CA_FILE": str(self.org_root),
            "SVC_CONTROL_PLANE_TOKEN": self.state["token"],
            "CACHE_ROOT": str(self.tmp / "cache"),
        }

    def run_example(self) -> subprocess.CompletedProcess[str]:
        script = self.tmp / "example.py"
        script.write_text(guide_example())
        return subprocess.run(
            [sys.executable, str(script)],
            env=self.environ(),
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def svc(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "svc"), *argv],
            env=self.environ(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def test_example_runs_twice(self) -> None:
        """The example runs to the end twice in a row; each run retires its own agent."""
        agents = []
        for _ in range(2):
            done = self.run_example()
            self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
            lines = done.stdout.splitlines()
            self.assertEqual(lines[1], "written: remember this", done.stdout)
            agent = lines[0].split(" of ", 1)[1].split(",", 1)[0]
            self.assertEqual(lines[2], f"owner uses 14 bytes; {agent}: 14")
            self.assertTrue(lines[3].startswith("purge sweep: "), done.stdout)
            agents.append(agent)
            mount_point = self.stack / "mnt" / "agents" / agent
            self.assertFalse(os.path.ismount(mount_point))
            self.assertNotIn(FSTYPE, fstypes_at(mount_point))
            mount_log = self.tmp / "cache" / agent / "mount.log"
            self.assertTrue(mount_log.exists())
            # The example's mount logs to a file: JSON lines by twist's default.
            check_json_log([mount_log])
        self.assertNotEqual(agents[0], agents[1])
        # Both runs' agents are retired and erased; svc lists them so, over HTTPS.
        listed = self.svc("agents", "list", "--owner", "acme", "--json")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        states = {a["agent_id"]: a["state"] for a in json.loads(listed.stdout)["agents"]}
        self.assertEqual(states, {agents[0]: "purged", agents[1]: "purged"})

    def test_fleet_commands(self) -> None:
        """gc sweep and purge sweep run against the real data plane, with progress."""
        client = Client(self.https_url, self.state["token"], ca_file=str(self.org_root))
        client.allocate_disk("retired-1", "fleet-owner", 1 << 20)
        client.delete_entity("agent", "retired-1")
        purged = self.svc("purge", "sweep", "--json")
        self.assertEqual(purged.returncode, 0, purged.stderr)
        body: dict[str, Any] = json.loads(purged.stdout)
        self.assertEqual([p["agent_id"] for p in body["purged"]], ["retired-1"])
        self.assertRegex(purged.stderr, r"purge 1/1 allocation [0-9a-f]{32} \(agent retired-1\)")
        collected = self.svc("gc", "sweep")
        self.assertEqual(collected.returncode, 0, collected.stderr)
        self.assertRegex(collected.stderr, r"^gc 1/1 localhost: [0-9]+ chunks, ")
        self.assertRegex(collected.stdout, r"^collected [0-9]+ chunks, .* on 1 of 1 servers\n$")
        usage = self.svc("usage", "show", "demo-owner")
        self.assertEqual(usage.returncode, 0, usage.stderr)
        self.assertIn("demo-agent", usage.stdout)
