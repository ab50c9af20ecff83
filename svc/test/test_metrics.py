"""
Tests for L{svc.metrics}: the exposition has exactly the specification's
families, types, labels and buckets, and promtool accepts it.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.trial.unittest import SynchronousTestCase

from svc.metrics import LATENCY_BUCKETS, OP_LABELS, DataPlaneMetrics, op_label
from svc.wire.ops import Op

# The specification's Metrics table: name -> (type, label names).
SPEC_FAMILIES: dict[str, tuple[str, frozenset[str]]] = {
    "svc_dataplane_op_duration_seconds": ("histogram", frozenset({"op"})),
    "svc_dataplane_bytes_total": ("counter", frozenset({"direction", "op"})),
    "svc_chunks_total": ("counter", frozenset({"state"})),
    "svc_lease_held": ("gauge", frozenset({"path"})),
    "svc_chunk_batch_duration_seconds": ("histogram", frozenset({"operation"})),
    "svc_chunk_batch_size": ("histogram", frozenset({"operation"})),
    "svc_chunk_batch_items_total": ("counter", frozenset({"operation", "result"})),
    "svc_journal_writes_total": ("counter", frozenset({"op", "allocation_id"})),
    "svc_journal_query_duration_seconds": ("histogram", frozenset()),
    "svc_journal_rows_total": ("gauge", frozenset({"allocation_id"})),
    "svc_journal_revert_total": ("counter", frozenset({"allocation_id", "result"})),
    "svc_session_forgery_rejected_total": ("counter", frozenset({"reason"})),
    "svc_session_rebind_total": ("counter", frozenset()),
    "svc_agent_path_denied_total": ("counter", frozenset({"op"})),
    # Added by this project (docs/specifications/metrics.md, decisions).
    "svc_dataplane_requests_refused_total": ("counter", frozenset({"reason"})),
    # Not in the specification: this project's decision (docs/specifications/metrics.md).
    "svc_dataplane_connections_refused_total": ("counter", frozenset({"reason"})),
}

# The specification's op values, then statfs (added by this project, docs/decisions.md).
UNTIMED_PUSHES = (Op.CHANGED, Op.CREDENTIALS_REVOKED, Op.SESSION_FENCED)
"""The pushes without a label (only C{lease_revoke} is timed)."""

SPEC_OPS = (
    "list stat manifest_get manifest_put manifest_delete manifest_rename dir_create "
    "dir_remove setattr symlink readlink mknod link chunk_get chunk_has chunk_put "
    "journal_query journal_revert_path ping close lease_grant lease_refresh "
    "lease_release lease_revoke statfs"
).split()

# 14 buckets, base 2, starting at 500 microseconds.
SPEC_LATENCY = [0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256]
SPEC_LATENCY += [0.512, 1.024, 2.048, 4.096]

# The one promtool lint finding: the spec names a gauge svc_journal_rows_total.
KNOWN_LINT = 'svc_journal_rows_total non-counter metrics should not have "_total" suffix'


def exercised() -> tuple[DataPlaneMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = DataPlaneMetrics(registry)
    metrics.observe_op("stat", 0.003)
    metrics.count_bytes("in", "chunk_put", 100)
    metrics.count_chunk("deduped")
    metrics.set_lease_held("/agent-1/f", 1)
    metrics.observe_chunk_batch("has", 0.01, 40)
    metrics.count_chunk_batch_items("delete", "missing", 2)
    metrics.count_journal_write("put", "alloc-1")
    metrics.observe_journal_query(0.02)
    metrics.set_journal_rows("alloc-1", 12)
    metrics.count_journal_revert("alloc-1", "reverted")
    metrics.count_session_forgery("fenced")
    metrics.count_session_rebind()
    metrics.count_path_denied("list")
    return metrics, registry


def exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode("utf-8")


def type_lines(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            found[name] = kind
    return found


class ExpositionTests(SynchronousTestCase):
    """
    The families as exposed.
    """

    def test_exact_family_names_and_types(self) -> None:
        """The exposition declares exactly the spec's families with the spec's types."""
        _, registry = exercised()
        self.assertEqual(
            type_lines(exposition(registry)),
            {name: kind for name, (kind, _labels) in SPEC_FAMILIES.items()},
        )

    def test_no_created_series(self) -> None:
        """No *_created series or families are exposed."""
        _, registry = exercised()
        self.assertNotIn("_created", exposition(registry))

    def test_labels(self) -> None:
        """Every family's samples carry exactly the spec's label names."""
        _, registry = exercised()
        for family in text_string_to_metric_families(exposition(registry)):
            exposed = family.name + ("_total" if family.type == "counter" else "")
            kind, labels = SPEC_FAMILIES[exposed]
            self.assertEqual(family.type, kind)
            self.assertTrue(family.samples, exposed)
            for sample in family.samples:
                self.assertEqual(set(sample.labels) - {"le"}, labels, exposed)
                if kind == "counter":
                    self.assertEqual(sample.name, exposed)

    def test_latency_buckets(self) -> None:
        """Duration histograms have 14 buckets, base 2, from 0.0005 s, then +Inf."""
        self.assertEqual(len(LATENCY_BUCKETS), 14)
        for got, want in zip(LATENCY_BUCKETS, SPEC_LATENCY, strict=True):
            self.assertAlmostEqual(got, want, places=12)
        _, registry = exercised()
        for family in text_string_to_metric_families(exposition(registry)):
            if family.type != "histogram":
                continue
            bounds = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
            self.assertEqual(bounds[-1], float("inf"))
            if family.name.endswith("_seconds"):
                self.assertEqual(bounds[:-1], SPEC_LATENCY, family.name)
            else:
                self.assertEqual(bounds[:-1], [float(2**i) for i in range(14)], family.name)

    def test_op_labels(self) -> None:
        """The op labels are the spec's list plus statfs (stat, no read); changed has none."""
        self.assertEqual(list(OP_LABELS), SPEC_OPS)
        self.assertNotIn("read", OP_LABELS)
        self.assertNotIn("changed", OP_LABELS)
        self.assertEqual(
            sorted(op_label(op) for op in Op if op not in UNTIMED_PUSHES),
            sorted(SPEC_OPS),
        )
        self.assertEqual(op_label(Op.HEAD_FILE), "stat")
        self.assertEqual(op_label(Op.LIST), "list")
        self.assertEqual(op_label(Op.STATFS), "statfs")

    def test_lease_held_removed(self) -> None:
        """svc_lease_held is 1 while held and its series is removed on release."""
        metrics, registry = exercised()
        self.assertEqual(registry.get_sample_value("svc_lease_held", {"path": "/agent-1/f"}), 1)
        metrics.set_lease_held("/agent-1/f", 2)
        self.assertEqual(registry.get_sample_value("svc_lease_held", {"path": "/agent-1/f"}), 1)
        metrics.set_lease_held("/agent-1/f", 0)
        self.assertNotIn('svc_lease_held{path="/agent-1/f"}', exposition(registry))
        metrics.set_lease_held("/agent-1/f", 0)

    def test_counts(self) -> None:
        """The helpers add to the right series."""
        metrics, registry = exercised()
        metrics.count_bytes("out", "manifest_get", 7)
        metrics.count_bytes("out", "manifest_get", 3)
        self.assertEqual(
            registry.get_sample_value(
                "svc_dataplane_bytes_total", {"direction": "out", "op": "manifest_get"}
            ),
            10,
        )
        self.assertEqual(registry.get_sample_value("svc_session_rebind_total"), 1)
        self.assertEqual(
            registry.get_sample_value("svc_journal_rows_total", {"allocation_id": "alloc-1"}), 12
        )
        self.assertEqual(registry.get_sample_value("svc_chunks_total", {"state": "fetched"}), 0)

    def test_connection_refusals(self) -> None:
        """Refusals count by reason; every reason's series exists at zero; others are refused."""
        metrics, registry = exercised()
        name = "svc_dataplane_connections_refused_total"
        self.assertEqual(registry.get_sample_value(name, {"reason": "pending_limit"}), 0)
        metrics.count_connection_refused("address_limit")
        metrics.count_connection_refused("address_limit")
        self.assertEqual(registry.get_sample_value(name, {"reason": "address_limit"}), 2)
        self.assertRaises(ValueError, metrics.count_connection_refused, "bored")

    def test_evicted_never_emitted(self) -> None:
        """The reserved chunk state evicted is refused and never exposed."""
        metrics, registry = exercised()
        self.assertRaises(ValueError, metrics.count_chunk, "evicted")
        self.assertNotIn("evicted", exposition(registry))

    def test_label_values_checked(self) -> None:
        """Label values outside the spec's sets are refused."""
        metrics, _ = exercised()
        self.assertRaises(ValueError, metrics.observe_op, "read", 0.1)
        self.assertRaises(ValueError, metrics.observe_op, "head_file", 0.1)
        self.assertRaises(ValueError, metrics.count_bytes, "in", "chunk_get", 1)
        self.assertRaises(ValueError, metrics.count_bytes, "sideways", "chunk_put", 1)
        self.assertRaises(ValueError, metrics.count_chunk_batch_items, "has", "deleted")
        self.assertRaises(ValueError, metrics.observe_chunk_batch, "put", 0.1, 1)
        self.assertRaises(ValueError, metrics.count_session_forgery, "other")
        self.assertRaises(ValueError, metrics.count_path_denied, "list_entries")

    def test_registries_independent(self) -> None:
        """Families go to the given registry only, never the global default one."""
        exercised()
        exercised()
        self.assertIsNone(
            prometheus_client.REGISTRY.get_sample_value("svc_chunks_total", {"state": "cached"})
        )


class PromtoolTests(SynchronousTestCase):
    """
    C{promtool check metrics} on the exposition.
    """

    def test_promtool_accepts(self) -> None:
        """promtool parses the exposition; its only lint finding is the spec's gauge name."""
        promtool = shutil.which("promtool")
        if promtool is None:
            if os.environ.get("CI") == "true":
                self.fail("promtool is required under CI=true")
            raise self.skipTest("promtool not installed")
        _, registry = exercised()
        result = subprocess.run(
            [promtool, "check", "metrics"],
            input=generate_latest(registry),
            capture_output=True,
            timeout=60,
            check=False,
        )
        output = (result.stdout + result.stderr).decode("utf-8", "replace")
        problems = {line.strip() for line in output.splitlines() if line.strip()}
        # Exit 1 is a parse error; 3 means lint findings only.
        self.assertIn(result.returncode, (0, 3), output)
        self.assertEqual(problems - {KNOWN_LINT}, set(), output)
        self.assertEqual(result.returncode == 3, bool(problems), output)
