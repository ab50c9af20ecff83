"""
Tests for L{svc.metrics.PathLabelPolicy}: what C{svc_lease_held}'s C{path}
label carries (C{SVC_METRICS_PATH_LABELS}).
"""

from __future__ import annotations

import hashlib
import hmac

from prometheus_client import CollectorRegistry, generate_latest
from twisted.trial.unittest import SynchronousTestCase

from svc.metrics import (
    PATH_LABEL_DOMAIN,
    DataPlaneMetrics,
    PathLabelPolicy,
    PathLabels,
    path_label_key,
)

TOKEN = "unit-test-service-token-" + "x" * 16
SCOPE = "user-1/tenant-a"
PATH = "/agent-1/secret-plans.txt"


def held(registry: CollectorRegistry) -> list[str]:
    """The path labels of the svc_lease_held series."""
    return [
        sample.labels["path"]
        for family in registry.collect()
        if family.name == "svc_lease_held"
        for sample in family.samples
    ]


class PathLabelPolicyTests(SynchronousTestCase):
    """The three modes, and the hash's exact definition."""

    def test_keep(self) -> None:
        """keep labels the series with the path itself (the specification's form)."""
        self.assertEqual(PathLabelPolicy().label(SCOPE, PATH), PATH)
        self.assertEqual(PathLabelPolicy.of(PathLabels.KEEP, TOKEN).label(SCOPE, PATH), PATH)

    def test_drop(self) -> None:
        """drop gives no label: no series."""
        self.assertIsNone(PathLabelPolicy.of(PathLabels.DROP, TOKEN).label(SCOPE, PATH))

    def test_hash_definition(self) -> None:
        """hash is 16 hex digits of HMAC(HMAC(token, domain), scope NUL path), SHA-256."""
        key = hmac.new(TOKEN.encode(), b"svc-metrics-path-label-v1", hashlib.sha256).digest()
        self.assertEqual(PATH_LABEL_DOMAIN, b"svc-metrics-path-label-v1")
        self.assertEqual(path_label_key(TOKEN), key)
        expected = hmac.new(key, f"{SCOPE}\0{PATH}".encode(), hashlib.sha256).hexdigest()[:16]
        label = PathLabelPolicy.of(PathLabels.HASH, TOKEN).label(SCOPE, PATH)
        self.assertEqual(label, expected)
        self.assertRegex(label or "", r"^[0-9a-f]{16}$")

    def test_hash_separates_tenants_and_keys(self) -> None:
        """The same path in two tenants, or under another token, hashes differently."""
        policy = PathLabelPolicy.of(PathLabels.HASH, TOKEN)
        other = PathLabelPolicy.of(PathLabels.HASH, TOKEN + "y")
        labels = {
            policy.label(SCOPE, PATH),
            policy.label("user-1/tenant-b", PATH),
            other.label(SCOPE, PATH),
        }
        self.assertEqual(len(labels), 3)

    def test_hash_needs_a_key(self) -> None:
        """A hash policy without a real key cannot be built."""
        self.assertRaises(ValueError, PathLabelPolicy, PathLabels.HASH, b"short")

    def test_key_not_in_repr(self) -> None:
        """The key stays out of repr."""
        policy = PathLabelPolicy.of(PathLabels.HASH, TOKEN)
        self.assertNotIn(repr(policy.key), repr(policy))


class LeaseHeldLabelTests(SynchronousTestCase):
    """svc_lease_held under each mode: the file name never reaches the exposition but in keep."""

    def metrics(self, mode: PathLabels) -> tuple[DataPlaneMetrics, CollectorRegistry]:
        registry = CollectorRegistry()
        return DataPlaneMetrics(registry, PathLabelPolicy.of(mode, TOKEN)), registry

    def test_hashed_series(self) -> None:
        """hash: one series per held path, under the hash; removed on release."""
        metrics, registry = self.metrics(PathLabels.HASH)
        metrics.set_lease_held(PATH, 1, SCOPE)
        label = PathLabelPolicy.of(PathLabels.HASH, TOKEN).label(SCOPE, PATH)
        self.assertEqual(held(registry), [label])
        self.assertNotIn(b"secret-plans", generate_latest(registry))
        self.assertNotIn(b"agent-1", generate_latest(registry))
        metrics.set_lease_held(PATH, 0, SCOPE)
        self.assertEqual(held(registry), [])

    def test_same_path_two_tenants(self) -> None:
        """hash: a release in one tenant leaves the other tenant's series."""
        metrics, registry = self.metrics(PathLabels.HASH)
        metrics.set_lease_held(PATH, 1, SCOPE)
        metrics.set_lease_held(PATH, 1, "user-2/tenant-b")
        metrics.set_lease_held(PATH, 0, SCOPE)
        self.assertEqual(len(held(registry)), 1)

    def test_dropped(self) -> None:
        """drop: the family is declared but has no series."""
        metrics, registry = self.metrics(PathLabels.DROP)
        metrics.set_lease_held(PATH, 1, SCOPE)
        self.assertEqual(held(registry), [])
        self.assertIn(b"# TYPE svc_lease_held gauge", generate_latest(registry))
        metrics.set_lease_held(PATH, 0, SCOPE)

    def test_kept(self) -> None:
        """keep: the path is the label, as the specification has it."""
        metrics, registry = self.metrics(PathLabels.KEEP)
        metrics.set_lease_held(PATH, 1, SCOPE)
        self.assertEqual(held(registry), [PATH])
