"""
The Prometheus metric families of the specification, in one place.

L{DataPlaneMetrics} creates every family of the spec's Metrics table in a
registry the caller supplies (never the process-wide default registry) and
offers one method per thing the server counts, each checking its label
values against the specification. The exposition is
C{prometheus_client.generate_latest(registry)}, served unauthenticated at
C{GET /metrics} with content type C{prometheus_client.CONTENT_TYPE_LATEST}.

The exposed names are exactly the specification's: counters are declared
with their C{_total} names, and the C{*_created} series that
C{prometheus_client} adds to counters and histograms are left out (they
would be extra families the specification does not name), without touching
the library's process-wide switch. C{svc_journal_rows_total} is a gauge whose
name ends in C{_total}, as the specification names it (promtool's linter
warns about that name; see ``docs/specifications/metrics.md``).

The C{path} label of C{svc_lease_held} names an agent's file (and, by its
first component, the agent): L{PathLabelPolicy} keeps it, replaces it with
a keyed hash, or drops the series (C{SVC_METRICS_PATH_LABELS}).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from svc.wire.ops import Op

LATENCY_BUCKETS: tuple[float, ...] = tuple(0.0005 * 2**i for i in range(14))
"""Every duration histogram: 14 buckets, base 2, from 500 microseconds
(0.0005 s to 4.096 s, plus C{+Inf})."""

BATCH_SIZE_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(14))
"""C{svc_chunk_batch_size}: 14 buckets, base 2, from 1 item (1 to 8192,
plus C{+Inf})."""

OP_LABELS: tuple[str, ...] = (
    "list",
    "stat",
    "manifest_get",
    "manifest_put",
    "manifest_delete",
    "manifest_rename",
    "dir_create",
    "dir_remove",
    "setattr",
    "symlink",
    "readlink",
    "mknod",
    "link",
    "chunk_get",
    "chunk_has",
    "chunk_put",
    "journal_query",
    "journal_revert_path",
    "ping",
    "close",
    "lease_grant",
    "lease_refresh",
    "lease_release",
    "lease_revoke",
    "statfs",
)
"""
The C{op} label values of the specification (there is no C{read}), and
C{statfs}, the operation this project adds (``docs/decisions.md``).
"""

BYTE_DIRECTIONS: Mapping[str, frozenset[str]] = {
    "in": frozenset({"chunk_put", "manifest_put"}),
    "out": frozenset({"chunk_get", "chunk_has", "manifest_get"}),
}
"""The C{op}s counted in each C{direction} of C{svc_dataplane_bytes_total}."""

CHUNK_STATES = ("fetched", "cached", "deduped")
"""C{svc_chunks_total} states emitted (C{evicted} is reserved, never emitted)."""

BATCH_RESULTS: Mapping[str, tuple[str, ...]] = {
    "has": ("present", "absent", "error"),
    "delete": ("deleted", "missing", "error"),
}
"""The C{result}s of C{svc_chunk_batch_items_total} for each C{operation}."""

FORGERY_REASONS = ("bad_format", "bad_hex", "unknown_or_wrong_holder", "fenced")

"""C{svc_session_forgery_rejected_total} reasons."""

REQUEST_REFUSAL_REASONS = (
    "not_a_map",
    "no_op",
    "too_large",
    "too_many_containers",
    "too_deep",
    "malformed",
)
"""Why a request was refused before its map was decoded (L{svc.wire.contract.RequestRefused})."""

CONNECTION_REFUSAL_REASONS = (
    "pending_limit",
    "address_limit",
    "handshake_timeout",
    "admission",
    "connection_limit",
    "agent_limit",
)
"""
C{svc_dataplane_connections_refused_total} reasons (a decision: the
family is not in the specification, C{docs/specifications/metrics.md}).
"""


class PathLabels(enum.Enum):
    """What C{svc_lease_held}'s C{path} label carries (C{SVC_METRICS_PATH_LABELS})."""

    KEEP = "keep"
    """The path itself, as the specification has it."""
    HASH = "hash"
    """16 hex digits of a keyed hash of the tenant and path (L{PathLabelPolicy.label})."""
    DROP = "drop"
    """No series at all: the family is declared and stays empty."""


PATH_LABEL_DOMAIN = b"svc-metrics-path-label-v1"
"""What the hash key is derived for (the HMAC message under the service token)."""

PATH_LABEL_HEX_DIGITS = 16


def path_label_key(service_token: str) -> bytes:
    """The C{hash} mode's key: HMAC-SHA256 of L{PATH_LABEL_DOMAIN} under the service token."""
    return hmac.new(service_token.encode("utf-8"), PATH_LABEL_DOMAIN, hashlib.sha256).digest()


@attrs.frozen
class PathLabelPolicy:
    """
    How a lease's path becomes the C{path} label (L{PathLabels}).

    In C{hash} mode the label is the first 16 hex digits of
    HMAC-SHA256(C{key}, C{"<owner>/<tenant>" NUL <path>}) (UTF-8): stable
    across restarts, different for the same path in two tenants, and not
    computable without the key (so a file name cannot be confirmed by
    guessing it). The key is L{path_label_key} of the service token.
    """

    mode: PathLabels = PathLabels.KEEP
    key: bytes = attrs.field(default=b"", repr=False)

    def __attrs_post_init__(self) -> None:
        if self.mode is PathLabels.HASH and len(self.key) < 16:
            raise ValueError("the hash mode needs a key of at least 16 bytes")

    @classmethod
    def of(cls, mode: PathLabels, service_token: str) -> PathLabelPolicy:
        """The policy of C{mode}, a C{hash} one keyed by the service token."""
        key = path_label_key(service_token) if mode is PathLabels.HASH else b""
        return cls(mode, key)

    def label(self, scope: str, path: str) -> str | None:
        """
        The label for C{path} of tenant C{scope} (C{"<owner>/<tenant>"}),
        or L{None} when the series is dropped.
        """
        if self.mode is PathLabels.DROP:
            return None
        if self.mode is PathLabels.KEEP:
            return path
        message = scope.encode("utf-8") + b"\0" + path.encode("utf-8")
        digest = hmac.new(self.key, message, hashlib.sha256).hexdigest()
        return digest[:PATH_LABEL_HEX_DIGITS]


def op_label(op: Op) -> str:
    """The C{op} label of a wire operation (C{head_file} is C{stat})."""
    return "stat" if op is Op.HEAD_FILE else op.value


def _check(value: str, allowed: Iterable[str], label: str) -> str:
    if value not in allowed:
        raise ValueError(f"{label} label value {value!r} is not one of the specification's")
    return value


def _non_empty(value: str, label: str) -> str:
    if not value:
        raise ValueError(f"{label} label value must not be empty")
    return value


class _WithoutCreated(Collector):
    """The families of an inner registry without their C{*_created} samples."""

    def __init__(self, inner: CollectorRegistry) -> None:
        self._inner = inner

    def collect(self) -> Iterable[Metric]:
        for family in self._inner.collect():
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield kept

    def describe(self) -> Iterable[Metric]:
        return self.collect()


class DataPlaneMetrics:
    """
    Every metric family of the data-plane server, registered in
    C{registry}. The attributes are the C{prometheus_client} metrics; the
    methods are the way the server should update them.

    @param path_labels: how C{svc_lease_held} labels its paths.
    """

    def __init__(
        self, registry: CollectorRegistry, path_labels: PathLabelPolicy | None = None
    ) -> None:
        self._path_labels = path_labels or PathLabelPolicy()
        inner = CollectorRegistry(auto_describe=True)
        # The series of the per-request families, by label values: looked
        # up once (with the values checked), then reused (C{labels} costs
        # several microseconds, and each request updates several series).
        self._series: dict[tuple[str, ...], Any] = {}
        self.op_duration = Histogram(
            "svc_dataplane_op_duration_seconds",
            "Time the data-plane server spent on one operation, by wire op.",
            ["op"],
            buckets=LATENCY_BUCKETS,
            registry=inner,
        )
        self.bytes = Counter(
            "svc_dataplane_bytes_total",
            "Payload bytes moved: in (client to server) and out, by op.",
            ["direction", "op"],
            registry=inner,
        )
        self.chunks = Counter(
            "svc_chunks_total",
            "Chunks served (fetched), stored fresh (cached) or found present (deduped).",
            ["state"],
            registry=inner,
        )
        self.lease_held = Gauge(
            "svc_lease_held",
            "1 while a lease on the path is held; the series is removed on release.",
            ["path"],
            registry=inner,
        )
        self.chunk_batch_duration = Histogram(
            "svc_chunk_batch_duration_seconds",
            "Time for one batched chunk has/delete.",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=inner,
        )
        self.chunk_batch_size = Histogram(
            "svc_chunk_batch_size",
            "Hashes in one batched chunk has/delete.",
            ["operation"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=inner,
        )
        self.chunk_batch_items = Counter(
            "svc_chunk_batch_items_total",
            "Items of batched chunk has/delete, by result.",
            ["operation", "result"],
            registry=inner,
        )
        self.journal_writes = Counter(
            "svc_journal_writes_total",
            "Rows appended to the journal, by journal op and allocation.",
            ["op", "allocation_id"],
            registry=inner,
        )
        self.journal_query_duration = Histogram(
            "svc_journal_query_duration_seconds",
            "Time for one journal query.",
            buckets=LATENCY_BUCKETS,
            registry=inner,
        )
        self.journal_rows = Gauge(
            "svc_journal_rows_total",
            "Rows currently in the journal, by allocation.",
            ["allocation_id"],
            registry=inner,
        )
        self.journal_reverts = Counter(
            "svc_journal_revert_total",
            "journal_revert_path requests, by allocation and result.",
            ["allocation_id", "result"],
            registry=inner,
        )
        self.session_forgery_rejected = Counter(
            "svc_session_forgery_rejected_total",
            "Presented session ids refused, by reason.",
            ["reason"],
            registry=inner,
        )
        self.session_rebinds = Counter(
            "svc_session_rebind_total",
            "Legitimate reconnects that rebound a live-lease session.",
            registry=inner,
        )
        self.agent_path_denied = Counter(
            "svc_agent_path_denied_total",
            "Operations refused for a path outside the agent's subtree, by op.",
            ["op"],
            registry=inner,
        )
        self.requests_refused = Counter(
            "svc_dataplane_requests_refused_total",
            "Requests answered EPROTO before their map was decoded, by reason.",
            ["reason"],
            registry=inner,
        )
        self.connections_refused = Counter(
            "svc_dataplane_connections_refused_total",
            "Data-plane connections dropped before admission or refused at it, by reason.",
            ["reason"],
            registry=inner,
        )
        self._preset()
        registry.register(_WithoutCreated(inner))

    def _preset(self) -> None:
        # Series of small fixed label sets exist at zero from the start.
        for direction, ops in BYTE_DIRECTIONS.items():
            for op in sorted(ops):
                self.bytes.labels(direction, op)
        for state in CHUNK_STATES:
            self.chunks.labels(state)
        for operation, results in BATCH_RESULTS.items():
            for result in results:
                self.chunk_batch_items.labels(operation, result)
        for reason in FORGERY_REASONS:
            self.session_forgery_rejected.labels(reason)
        for reason in REQUEST_REFUSAL_REASONS:
            self.requests_refused.labels(reason)
        for reason in CONNECTION_REFUSAL_REASONS:
            self.connections_refused.labels(reason)

    def _series_for(self, key: tuple[str, ...], make: Callable[[], Any]) -> Any:
        """The series of C{key}: made (its label values checked) the first time only."""
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = make()
        return series

    def observe_op(self, op: str, seconds: float) -> None:
        """One operation took C{seconds} (C{op} an L{OP_LABELS} value)."""
        self._series_for(
            ("op", op), lambda: self.op_duration.labels(_check(op, OP_LABELS, "op"))
        ).observe(seconds)

    def count_bytes(self, direction: str, op: str, n: int) -> None:
        """C{n} payload bytes moved in C{direction} (C{in}/C{out}) by C{op}."""

        def series() -> Any:
            ops = BYTE_DIRECTIONS.get(_check(direction, BYTE_DIRECTIONS, "direction"), frozenset())
            return self.bytes.labels(direction, _check(op, ops, f"op for direction {direction}"))

        self._series_for(("bytes", direction, op), series).inc(n)

    def count_chunk(self, state: str, n: int = 1) -> None:
        """C{n} chunks C{fetched} (chunk_get hit), C{cached} (chunk_put
        stored fresh bytes) or C{deduped} (chunk_put content existed)."""
        self._series_for(
            ("chunks", state), lambda: self.chunks.labels(_check(state, CHUNK_STATES, "state"))
        ).inc(n)

    def set_lease_held(self, path: str, leases_on_path: int, scope: str = "") -> None:
        """
        Track the leases on C{path} of tenant C{scope} (C{"<owner>/<tenant>"})
        after a lease event: the series is 1 while any is held and removed
        when none is left (its label per the L{PathLabelPolicy}).
        """
        label = self._path_labels.label(scope, _non_empty(path, "path"))
        if label is None:
            return
        if leases_on_path > 0:
            self.lease_held.labels(label).set(1)
        else:
            self.lease_held.remove(label)

    def observe_chunk_batch(self, operation: str, seconds: float, size: int) -> None:
        """One batched C{operation} (C{has}/C{delete}) of C{size} hashes."""
        _check(operation, BATCH_RESULTS, "operation")
        self.chunk_batch_duration.labels(operation).observe(seconds)
        self.chunk_batch_size.labels(operation).observe(size)

    def count_chunk_batch_items(self, operation: str, result: str, n: int = 1) -> None:
        """C{n} items of a batched C{operation} ended with C{result}."""
        results = BATCH_RESULTS.get(_check(operation, BATCH_RESULTS, "operation"), ())
        self.chunk_batch_items.labels(operation, _check(result, results, "result")).inc(n)

    def count_journal_write(self, op: str, allocation_id: str) -> None:
        """One journal row of journal op C{op} appended for C{allocation_id}."""
        self._series_for(
            ("journal", op, allocation_id),
            lambda: self.journal_writes.labels(
                _non_empty(op, "op"), _non_empty(allocation_id, "allocation_id")
            ),
        ).inc()

    def observe_journal_query(self, seconds: float) -> None:
        """One journal query took C{seconds}."""
        self.journal_query_duration.observe(seconds)

    def set_journal_rows(self, allocation_id: str, rows: int) -> None:
        """The journal of C{allocation_id} now holds C{rows} rows."""
        self.journal_rows.labels(_non_empty(allocation_id, "allocation_id")).set(rows)

    def forget_allocation(self, allocation_id: str) -> None:
        """Drop the C{svc_journal_rows_total} series of a removed allocation."""
        self.journal_rows.remove(allocation_id)

    def count_journal_revert(self, allocation_id: str, result: str) -> None:
        """One C{journal_revert_path} for C{allocation_id} ended with C{result}."""
        self.journal_reverts.labels(
            _non_empty(allocation_id, "allocation_id"), _non_empty(result, "result")
        ).inc()

    def count_session_forgery(self, reason: str) -> None:
        """A presented session id was refused for C{reason}."""
        self.session_forgery_rejected.labels(_check(reason, FORGERY_REASONS, "reason")).inc()

    def count_session_rebind(self) -> None:
        """A legitimate reconnect rebound its live-lease session."""
        self.session_rebinds.inc()

    def count_request_refused(self, reason: str) -> None:
        """A request was refused before its map was decoded, for C{reason}."""
        self.requests_refused.labels(_check(reason, REQUEST_REFUSAL_REASONS, "reason")).inc()

    def count_connection_refused(self, reason: str) -> None:
        """A data-plane connection was dropped or refused for C{reason}."""
        self.connections_refused.labels(_check(reason, CONNECTION_REFUSAL_REASONS, "reason")).inc()

    def count_path_denied(self, op: str) -> None:
        """One C{allowed: false} path-confinement line was written for C{op}."""
        self.agent_path_denied.labels(_check(op, OP_LABELS, "op")).inc()
