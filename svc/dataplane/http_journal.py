"""
The control plane's access to a tenant's write journal on this server
(C{GET /control/journal}, C{POST /control/journal/revert};
C{docs/specifications/control-dataplane.md}): parsing the query and the
body into values, the (long-polled) page read, and the owner's revert with
its store errors translated into API errors.

Parsing is pure and raises L{InvalidRequest} naming the parameter. The
reads and the revert only touch a tenant that already has storage on this
server (L{present_tenant}); they never create one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.python.failure import Failure

from svc.dataplane.confinement import is_canonical
from svc.dataplane.replies import journal_entry_map, revert_map
from svc.pki import names
from svc.pki.errors import InvalidName
from svc.store import errors as store_errors
from svc.store.engine import EngineClock, StorageEngine, scan_owner_tenants
from svc.store.journal import MAX_PAGE, JournalPage, JournalQuery, RevertResult
from svc.store.layout import TenantLocation, is_valid_id
from svc.store.manifest_values import Writer
from svc.store.tenant import TenantStorage
from svc.web.errors import AccessDenied, Conflict, InvalidRequest, JsonValue, NotFound
from svc.wire.messages import MAX_NAME_BYTES, MAX_PATH_BYTES
from svc.worker import IWorker

MAX_WAIT_SECONDS = 30.0
"""The longest long-poll C{wait} accepted."""

MAX_AGENT_CHARS = 256
"""The longest C{agent} filter accepted."""

OWNER_AGENT_PREFIX = "owner:"
"""The journal author of an owner's revert is C{owner:<user_id>}."""

MAX_INT = 2**63 - 1
"""The largest seq, cursor or millisecond time accepted (a signed 64-bit integer)."""

DISK_ROOT = "disk_root"
"""The C{error_description} of a revert of a top-level directory (403)."""

CHUNKS_COLLECTED = "chunks_collected"
"""The C{error_description} of a revert whose bytes were garbage-collected (409)."""

_INTEGER = re.compile(r"[0-9]{1,19}")
_SECONDS = re.compile(r"[0-9]{1,3}(\.[0-9]{1,6})?")
_BOOLEANS = {"1": True, "true": True, "0": False, "false": False}
_ORDERS = {"asc": False, "desc": True}


@attrs.frozen
class JournalListing:
    """
    A C{GET /control/journal}: which page of C{location}'s journal, and how
    long to wait (seconds, oldest-first pages only) for a row when the page
    would be empty.
    """

    location: TenantLocation
    query: JournalQuery
    wait_seconds: float


@attrs.frozen
class OwnerRevert:
    """A C{POST /control/journal/revert}: restore C{path} to before row C{seq}."""

    location: TenantLocation
    path: str
    seq: int
    user_id: str

    @property
    def writer(self) -> Writer:
        """The journal author: C{owner:<user_id>}."""
        return Writer(OWNER_AGENT_PREFIX + self.user_id)

    @property
    def allocation(self) -> str:
        """The C{allocation_id} metric label: C{<tenant>/<top-level directory>}."""
        return f"{self.location.tenant}/{self.path.split('/')[1]}"


# Query parsing


def _parameter(args: Mapping[bytes, Sequence[bytes]], name: str) -> str | None:
    values = args.get(name.encode("ascii"), [])
    if not values:
        return None
    if len(values) > 1:
        raise InvalidRequest(f"repeated_{name}")
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(f"bad_{name}") from None


def _required(args: Mapping[bytes, Sequence[bytes]], name: str) -> str:
    value = _parameter(args, name)
    if value is None:
        raise InvalidRequest(f"missing_{name}")
    return value


def _integer(text: str | None, name: str, low: int, high: int = MAX_INT) -> int | None:
    if text is None:
        return None
    if _INTEGER.fullmatch(text) is None or not low <= int(text) <= high:
        raise InvalidRequest(f"bad_{name}")
    return int(text)


def _location(owner: object, tenant: object) -> TenantLocation:
    if not isinstance(owner, str) or not is_valid_id(owner):
        raise InvalidRequest("bad_owner")
    if not isinstance(tenant, str):
        raise InvalidRequest("bad_tenant")
    try:
        return TenantLocation(owner, tenant)
    except ValueError:
        raise InvalidRequest("bad_tenant") from None


def _path(value: object) -> str:
    if not is_canonical(value):
        raise InvalidRequest("bad_path")
    assert isinstance(value, str)
    encoded = value.encode("utf-8")
    if len(encoded) > MAX_PATH_BYTES or any(
        len(part) > MAX_NAME_BYTES for part in encoded.split(b"/")
    ):
        raise InvalidRequest("bad_path")
    return value


def _wait(text: str | None) -> float:
    if text is None:
        return 0.0
    if _SECONDS.fullmatch(text) is None or float(text) > MAX_WAIT_SECONDS:
        raise InvalidRequest("bad_wait")
    return float(text)


def parse_journal_listing(args: Mapping[bytes, Sequence[bytes]]) -> JournalListing:
    """
    The query of C{GET /control/journal}: C{owner}, C{tenant} (required);
    C{path}, C{below}, C{agent}, C{since_ms}, C{until_ms}, C{cursor},
    C{limit}, C{order}, C{wait} (optional, each at most once). Unknown
    parameters are ignored.
    """
    location = _location(_required(args, "owner"), _required(args, "tenant"))
    path_text = _parameter(args, "path")
    path = None if path_text is None else _path(path_text)
    below_text = _parameter(args, "below")
    if below_text is not None and below_text not in _BOOLEANS:
        raise InvalidRequest("bad_below")
    agent = _parameter(args, "agent")
    if agent is not None and not 1 <= len(agent) <= MAX_AGENT_CHARS:
        raise InvalidRequest("bad_agent")
    order = _parameter(args, "order") or "asc"
    if order not in _ORDERS:
        raise InvalidRequest("bad_order")
    limit = _integer(_parameter(args, "limit"), "limit", 1, MAX_PAGE)
    wait_seconds = _wait(_parameter(args, "wait"))
    if wait_seconds > 0 and _ORDERS[order]:
        raise InvalidRequest("wait_requires_asc")
    query = JournalQuery(
        path=path,
        below=False if below_text is None else _BOOLEANS[below_text],
        agent_id=agent,
        since_ms=_integer(_parameter(args, "since_ms"), "since_ms", 0),
        until_ms=_integer(_parameter(args, "until_ms"), "until_ms", 0),
        cursor=_integer(_parameter(args, "cursor"), "cursor", 0),
        newest_first=_ORDERS[order],
        **({} if limit is None else {"limit": limit}),
    )
    return JournalListing(location, query, wait_seconds)


# Body parsing


def parse_owner_revert(body: Mapping[str, JsonValue]) -> OwnerRevert:
    """
    C{{"owner", "tenant", "path", "seq", "user_id"}}, all required. The
    path must be canonical and not C{/}; whether it is a disk root is
    L{check_not_disk_root}'s (403, not 400).
    """
    for name in ("owner", "tenant", "path", "seq", "user_id"):
        if name not in body:
            raise InvalidRequest(f"missing_{name}")
    location = _location(body["owner"], body["tenant"])
    path = _path(body["path"])
    if path == "/":
        raise InvalidRequest("bad_path")
    seq = body["seq"]
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= MAX_INT:
        raise InvalidRequest("bad_seq")
    user_id = body["user_id"]
    if not isinstance(user_id, str):
        raise InvalidRequest("bad_user_id")
    try:
        names.check_id(user_id, "user id")
    except InvalidName:
        raise InvalidRequest("bad_user_id") from None
    return OwnerRevert(location, path, seq, user_id)


def check_not_disk_root(path: str) -> None:
    """
    Refuse a top-level directory C{/<name>}: it is an agent's disk root,
    which may not be reverted (the rule C{journal_revert_path} applies to
    agents, extended to every disk since the owner may revert any path).

    @raise AccessDenied: C{disk_root}.
    """
    if path.count("/") == 1:
        raise AccessDenied(DISK_ROOT)


# Storage


async def present_tenant(
    engine: StorageEngine, io: IWorker, location: TenantLocation
) -> TenantStorage:
    """
    The storage of C{location} when it already exists on this server (open,
    or with a chunk store on disk); never creates one.

    @raise NotFound: C{unknown_tenant}.
    """
    if not any(storage.location == location for storage in engine.opened()):
        root = engine.roots.tenants_root
        present = await io.submit(lambda: scan_owner_tenants(root, location.owner))
        if location not in present:
            raise NotFound("unknown_tenant")
    return await engine.tenant(location)


async def last_seq(storage: TenantStorage) -> int:
    """The newest row's seq in the tenant's journal, 0 when it is empty."""
    page = await storage.journal_query(JournalQuery(limit=1, newest_first=True))
    return page.entries[0].seq if page.entries else 0


def journal_answer(page: JournalPage, newest: int) -> dict[str, JsonValue]:
    """C{{"entries", "next_cursor", "last_seq"}}, entries as C{journal_query} renders them."""
    entries = [cast(JsonValue, journal_entry_map(entry)) for entry in page.entries]
    return {"entries": entries, "next_cursor": page.next_cursor, "last_seq": newest}


def _ignore_cancelled(failure: Failure) -> Failure | None:
    return None if isinstance(failure.value, CancelledError) else failure


def _forget(waiter: Deferred[None] | None) -> None:
    if waiter is not None and not waiter.called:
        waiter.addErrback(_ignore_cancelled)
        waiter.cancel()


def _cancel_on(lost: Deferred[None], waiter: Deferred[None]) -> None:
    def cancel(failure: Failure) -> None:
        waiter.cancel()

    lost.addErrback(cancel)


async def read_journal(
    storage: TenantStorage,
    listing: JournalListing,
    clock: EngineClock,
    notify_finish: Callable[[], Deferred[None]],
    observe: Callable[[float], object] = lambda seconds: None,
) -> dict[str, JsonValue]:
    """
    The page of C{listing} with the journal's L{last_seq}. With a C{wait},
    an empty page is not answered at once: the query runs again each time
    the tenant's journal gets a row, until the page has entries or the wait
    (on C{clock}) has passed; then the last query's page is answered (empty
    at the timeout). The waiter is registered before each query runs, so a
    row committed in between is not missed; it is cancelled when the
    request's connection is lost (C{notify_finish}, a new L{Deferred} per
    call, as C{Request.notifyFinish}). C{observe} gets each query's duration.
    """
    deadline = clock.seconds() + listing.wait_seconds
    while True:
        remaining = deadline - clock.seconds()
        waiter = storage.journal_changed() if remaining > 0 else None
        try:
            started = clock.seconds()
            page = await storage.journal_query(listing.query)
            observe(clock.seconds() - started)
            newest = await last_seq(storage)
        except BaseException:
            _forget(waiter)
            raise
        if page.entries or waiter is None:
            _forget(waiter)
            return journal_answer(page, newest)
        _cancel_on(notify_finish(), waiter)
        reactor: Any = clock
        try:
            await waiter.addTimeout(deadline - clock.seconds(), reactor)
        except DeferredTimeout:
            deadline = clock.seconds()  # one last query, then answer


async def revert_as_owner(storage: TenantStorage, request: OwnerRevert) -> RevertResult:
    """
    Revert C{request.path} to its state before row C{request.seq}, written
    by C{owner:<user_id>}; store refusals become API errors: no such row or
    a row about another path is 404 C{not_found}; collected chunks are 409
    C{conflict}/C{chunks_collected}; any other refusal (a non-empty
    directory in the way, the parent gone) is 409 C{conflict} described by
    the lowercase errno name (C{enotempty}, C{enoent}, ...).
    """
    entry = await storage.manifests.journal_entry(request.seq)
    if entry is None or not entry.concerns(request.path):
        raise NotFound("no_such_entry")
    try:
        return await storage.journal_revert(request.path, request.seq, writer=request.writer)
    except store_errors.ChunksCollected:
        raise Conflict("conflict", CHUNKS_COLLECTED) from None
    except store_errors.InvalidArgument:
        raise InvalidRequest("bad_path") from None
    except (
        store_errors.NotFound,
        store_errors.NotEmpty,
        store_errors.AlreadyExists,
        store_errors.NotADirectory,
        store_errors.IsADirectory,
        store_errors.NotPermitted,
    ) as e:
        raise Conflict("conflict", e.errno.name.lower()) from None


def revert_answer(result: RevertResult) -> dict[str, JsonValue]:
    """
    C{{"path", "reverted_seq", "journal_seq", "exists"}}, plus C{kind},
    C{version} and C{size} when the path exists afterwards.
    """
    answer: dict[str, JsonValue] = {"path": result.path}
    answer.update(cast(dict[str, JsonValue], revert_map(result)))
    return answer
