"""
The deployment files in C{deploy/} (they cannot be started here, so their
syntax and consistency are checked):

  - the Prometheus alert rules pass C{promtool check rules} and their unit
    tests (C{promtool test rules deploy/prometheus/alerts_test.yml});
  - every query of the Grafana dashboard is valid PromQL (checked by
    promtool as recording rules) and, like every alert, names only metric
    families the data-plane server exports;
  - the systemd units pass C{systemd-analyze verify} without a single
    warning (the install prefix C{/opt/svc} replaced by this checkout's
    virtual environment: C{verify} requires the program to exist), keep
    the sandboxing they document, and take every secret as a credential
    file;
  - the Containerfile is checked by a parser (no image builder runs here):
    known instructions only, sources that exist, a non-root user, an entry
    point that is the installed C{twist}, and Debian packages that exist.

Under C{CI=true} a missing C{promtool} or C{systemd-analyze} is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.trial.unittest import SkipTest, TestCase

from svc.metrics import DataPlaneMetrics

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "svc.json"
UNITS = DEPLOY / "systemd"
CONTAINERFILE = DEPLOY / "Containerfile"
INSTALL_PREFIX = "/opt/svc"
VENV_BIN = Path(sys.executable).parent

METRIC = re.compile(r"\b(svc_[a-z_]+)\b")
SAMPLE_SUFFIXES = ("_bucket", "_count", "_sum", "_total")
"""Histogram samples, and counters (whose family name prometheus_client gives without _total)."""


def tool(name: str) -> str:
    """The path of C{name}; skipped when missing, a failure under CI=true."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI") == "true":
            raise AssertionError(f"{name} is required under CI=true (scripts/system-packages.txt)")
        raise SkipTest(f"{name} is not installed")
    return found


def exported_families() -> set[str]:
    """The metric family names a data-plane server exports."""
    registry = CollectorRegistry()
    DataPlaneMetrics(registry)
    return {family.name for family in registry.collect()}


def family_of(series: str, families: set[str]) -> str:
    """The family a series name belongs to (the name itself when it is one)."""
    if series in families:
        return series
    for suffix in SAMPLE_SUFFIXES:
        if series.endswith(suffix) and series.removesuffix(suffix) in families:
            return series.removesuffix(suffix)
    return series


def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def dashboard_queries() -> list[str]:
    """Every panel query, with Grafana's interval variable made concrete."""
    return [
        target["expr"].replace("$__rate_interval", "5m")
        for panel in dashboard()["panels"]
        for target in panel["targets"]
    ]


class PrometheusFilesTests(TestCase):
    """The alert rules and the dashboard's queries, by promtool."""

    def run_promtool(self, *argv: str) -> str:
        done = subprocess.run(
            [tool("promtool"), *argv],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=ALERTS.parent,
        )
        output = done.stdout + done.stderr
        self.assertEqual(done.returncode, 0, output)
        return output

    def test_alert_rules_check(self) -> None:
        """promtool check rules accepts deploy/prometheus/alerts.yml."""
        self.assertIn("SUCCESS: 8 rules found", self.run_promtool("check", "rules", str(ALERTS)))

    def test_alert_rules_fire(self) -> None:
        """promtool test rules: each alert fires on its series and not on those it excludes."""
        self.assertIn("SUCCESS", self.run_promtool("test", "rules", str(ALERT_TESTS)))

    def test_dashboard_queries_parse(self) -> None:
        """Every dashboard query is valid PromQL (promtool, as recording rules)."""
        queries = dashboard_queries()
        rules = [{"record": f"svc:dashboard:query_{n}", "expr": q} for n, q in enumerate(queries)]
        checked = Path(self.mktemp()).resolve()
        checked.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
        output = self.run_promtool("check", "rules", str(checked))
        self.assertIn(f"SUCCESS: {len(queries)} rules found", output)

    def test_only_exported_metrics(self) -> None:
        """The alerts and the dashboard name only families the data plane exports."""
        families = exported_families()
        text = ALERTS.read_text() + "\n".join(dashboard_queries())
        named = {family_of(name, families) for name in METRIC.findall(text)}
        self.assertEqual(named - families, set())
        self.assertGreaterEqual(len(named), 12)


class DashboardTests(TestCase):
    """The Grafana dashboard's structure."""

    def test_structure(self) -> None:
        """Unique panel ids, a 24-column grid, every query on the datasource variable."""
        document = dashboard()
        self.assertEqual(document["uid"], "svc-dataplane")
        variables = {v["name"]: v for v in document["templating"]["list"]}
        self.assertEqual(variables["datasource"]["query"], "prometheus")
        panels = document["panels"]
        self.assertEqual(len({p["id"] for p in panels}), len(panels))
        for panel in panels:
            grid = panel["gridPos"]
            self.assertLessEqual(grid["x"] + grid["w"], 24, panel["title"])
            self.assertTrue(panel["targets"], panel["title"])
            for target in panel["targets"]:
                self.assertEqual(target["datasource"]["uid"], "${datasource}")
                self.assertIn('instance=~"$instance"', target["expr"], panel["title"])


class SystemdUnitTests(TestCase):
    """The three units."""

    def units(self) -> list[Path]:
        found = sorted(UNITS.glob("*.service"))
        self.assertEqual(
            [u.name for u in found],
            ["svc-control.service", "svc-dataplane.service", "svc-mount@.service"],
        )
        return found

    def settings(self, unit: Path) -> dict[str, list[str]]:
        """Each key's values, in order (a key may repeat)."""
        found: dict[str, list[str]] = {}
        for line in unit.read_text().splitlines():
            if "=" in line and not line.startswith(("#", "[")):
                key, value = line.split("=", 1)
                found.setdefault(key, []).append(value)
        return found

    def test_verify(self) -> None:
        """systemd-analyze verify reports nothing at all about any unit."""
        verify = tool("systemd-analyze")
        copies = Path(self.mktemp())
        copies.mkdir()
        for unit in self.units():
            text = unit.read_text()
            self.assertIn(f"ExecStart={INSTALL_PREFIX}/bin/twist ", text + " ")
            (copies / unit.name).write_text(text.replace(f"{INSTALL_PREFIX}/bin/", f"{VENV_BIN}/"))
        done = subprocess.run(
            [verify, "verify", *sorted(str(p) for p in copies.iterdir())],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        self.assertEqual((done.returncode, done.stdout + done.stderr), (0, ""))

    def test_sandboxing(self) -> None:
        """The two servers are sandboxed; the mount keeps the host's mount namespace."""
        for unit in self.units():
            settings = self.settings(unit)
            self.assertEqual(settings["NoNewPrivileges"], ["yes"], unit.name)
            if unit.name.startswith("svc-mount"):
                namespaced = {"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices"}
                self.assertEqual(namespaced & settings.keys(), set(), unit.name)
                self.assertEqual(settings["DeviceAllow"], ["/dev/fuse rw"])
                self.assertEqual(settings["CapabilityBoundingSet"], ["CAP_SYS_ADMIN"])
            else:
                self.assertEqual(settings["ProtectSystem"], ["strict"], unit.name)
                self.assertEqual(settings["CapabilityBoundingSet"], [""], unit.name)
                self.assertEqual(settings["User"], ["svc"], unit.name)

    def test_secrets_are_credential_files(self) -> None:
        """Every secret reaches its process as a _FILE in the credentials directory."""
        expected = {
            "svc-control.service": {
                "SVC_CONTROL_PLANE_TOKEN_FILE",
                "SVC_CA_KEK_FILE",
                "DATABASE_URL_FILE",
            },
            "svc-dataplane.service": {"SVC_CONTROL_PLANE_TOKEN_FILE"},
            "svc-mount@.service": {"SVC_ENROLL_TOKEN_FILE"},
        }
        for unit in self.units():
            settings = self.settings(unit)
            credentials = {c.split(":", 1)[0] for c in settings["LoadCredential"]}
            files = {}
            for value in settings.get("Environment", []):
                name, _, path = value.partition("=")
                if name.endswith("_FILE"):
                    files[name] = path
            self.assertEqual(set(files), expected[unit.name], unit.name)
            self.assertEqual({p.removeprefix("%d/") for p in files.values()}, credentials)
            for secret in expected[unit.name]:
                self.assertNotIn(secret.removesuffix("_FILE") + "=", unit.read_text())


class ContainerfileTests(TestCase):
    """deploy/Containerfile, by a parser."""

    INSTRUCTIONS = frozenset(
        "FROM RUN COPY ADD ENV ARG USER WORKDIR VOLUME EXPOSE ENTRYPOINT CMD LABEL".split()
    )

    def instructions(self) -> list[tuple[str, str]]:
        """(instruction, arguments), continuation lines joined, comments dropped."""
        joined: list[str] = []
        pending = ""
        for line in CONTAINERFILE.read_text().splitlines():
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            pending += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
            if not line.endswith("\\"):
                joined.append(pending)
                pending = ""
        self.assertEqual(pending, "", "a continuation at the end of the file")
        parsed = []
        for instruction in joined:
            keyword, _, arguments = instruction.partition(" ")
            self.assertIn(keyword, self.INSTRUCTIONS, instruction)
            parsed.append((keyword, arguments.strip()))
        return parsed

    def test_sources_exist(self) -> None:
        """Every COPY source (but copies from a stage) exists in the build context."""
        for keyword, arguments in self.instructions():
            if keyword == "COPY" and not arguments.startswith("--from="):
                *sources, _target = arguments.split()
                for source in sources:
                    self.assertTrue((ROOT / source).exists(), source)

    def test_final_stage(self) -> None:
        """The image runs the installed twist as a non-root user, svc-control by default."""
        parsed = self.instructions()
        stages = [n for n, (keyword, _) in enumerate(parsed) if keyword == "FROM"]
        self.assertEqual(len(stages), 2)
        final = dict(parsed[stages[-1] :])
        self.assertEqual(final["USER"], "svc")
        self.assertEqual(json.loads(final["ENTRYPOINT"]), [f"{INSTALL_PREFIX}/bin/twist"])
        self.assertEqual(json.loads(final["CMD"]), ["svc-control"])
        self.assertIn(f"python -m venv {INSTALL_PREFIX}", dict(parsed[: stages[-1]])["RUN"])
        base = {arguments.split()[0] for keyword, arguments in parsed if keyword == "FROM"}
        self.assertEqual(base, {"docker.io/library/python:3.11-slim-bookworm"})

    def test_debian_packages_exist(self) -> None:
        """The packages apt-get installs exist in Debian (the base image's distribution)."""
        if shutil.which("apt-cache") is None:
            raise SkipTest("apt-cache is not installed")
        packages = []
        for keyword, arguments in self.instructions():
            if keyword == "RUN" and "apt-get install" in arguments:
                words = arguments.split("apt-get install", 1)[1].split("&&", 1)[0].split()
                packages += [w for w in words if not w.startswith("-")]
        self.assertEqual(
            sorted(packages), sorted("gcc pkg-config libfuse-dev fuse libfuse2".split())
        )
        done = subprocess.run(
            ["apt-cache", "show", "--no-all-versions", *packages],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        shown = set(re.findall(r"^Package: (\S+)$", done.stdout, re.M))
        self.assertEqual(shown, set(packages))
