"""
The data-plane server's deny-list: merged, aged out, kept on disk, and
brought up to date from the control plane before the server accepts agents.

The spec has the control plane push "the full active revocation set about
every 60 s" and the server "merges into an in-memory deny-list"; its
revocation record "entries age out once the cert would have expired".
L{Revocations} holds that list for one server:

  - L{Revocations.merge} adds a pushed set to the list in force: a serial
    stays listed until its own C{not_after} has passed, whether or not a
    later push names it again (so a push that leaves a serial out, or one
    that arrives out of order, never re-admits anyone). The merged list is
    installed at once (the data-plane service then closes the live
    connections it names) and written to disk before the push is answered.
  - L{Revocations.start}, before the listeners open, loads the list the
    server kept and, when there is a control plane, pulls the current set
    (C{GET /control/cert-revocations}, L{svc.dataplane.control_queries}) and
    merges it. A control plane that does not answer within the pull's
    timeout is logged and the server starts with the list it kept (the
    next push completes it). A kept list that cannot be read is replaced by
    the pulled set; without one to pull, the server refuses to start
    (L{DenyListUnavailable}) rather than serve with an unknown list.

File (C{docs/specifications/dataplane-http.md}, "Deny-list file"):
C{<SVC_STATE_DIR>/deny-list.json}, mode 0600, replaced atomically
(L{svc.durable.write_file_atomically}) after every change::

    {"version": 1, "saved_at": "2026-11-22T19:00:00Z",
     "revocations": [{"serial": "1f3a", "not_after": "2026-11-22T20:00:00Z"}]}

Entries are sorted by serial; serials are canonical lowercase hex;
timestamps are RFC 3339 UTC with a C{Z} suffix. Entries already expired when
the file is read are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from twisted.internet.defer import Deferred, DeferredLock
from twisted.logger import Logger

from svc.durable import make_directories, write_file_atomically
from svc.pki import names
from svc.pki.errors import InvalidName
from svc.pki.identity import DeniedSerial, DenyList
from svc.worker import IWorker

DENY_LIST_FILE = "deny-list.json"
"""The file name, in the server's state directory."""

FORMAT_VERSION = 1

PullRevocations = Callable[[], Deferred[DenyList]]
"""Asks the control plane for its active revocation set (bounded in time)."""

_log = Logger()


class Seconds(Protocol):
    """The part of a reactor (or C{Clock}) used here."""

    def seconds(self) -> float:
        """Now, in seconds since the epoch."""


class DenyListFileError(ValueError):
    """The deny-list file exists but cannot be understood."""


class DenyListUnavailable(Exception):
    """
    The server has no trustworthy deny-list to start with: its file cannot
    be read and there is no control plane answer to replace it.
    """


def timestamp(moment: datetime) -> str:
    """C{moment} as RFC 3339 UTC with a C{Z} suffix (microseconds only when set)."""
    return names.check_utc(moment, "timestamp").isoformat().replace("+00:00", "Z")


def render_deny_list(deny_list: DenyList, saved_at: datetime) -> bytes:
    """The C{deny-list.json} document for C{deny_list}."""
    entries = sorted(deny_list.entries, key=lambda e: (e.serial, e.not_after))
    document = {
        "version": FORMAT_VERSION,
        "saved_at": timestamp(saved_at),
        "revocations": [{"serial": e.serial, "not_after": timestamp(e.not_after)} for e in entries],
    }
    return json.dumps(document, separators=(",", ":")).encode() + b"\n"


def parse_deny_list(raw: bytes, source: str) -> DenyList:
    """
    The deny-list in a C{deny-list.json} document (expired entries
    included).

    @raise DenyListFileError: not the documented format, naming C{source}.
    """
    try:
        document = json.loads(raw)
    except ValueError as e:
        raise DenyListFileError(f"{source}: not JSON: {e}") from None
    if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
        raise DenyListFileError(f"{source}: not a version {FORMAT_VERSION} deny-list file")
    entries = document.get("revocations")
    if not isinstance(entries, list):
        raise DenyListFileError(f"{source}: 'revocations' must be an array")
    denied: list[DeniedSerial] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise DenyListFileError(f"{source}: an entry is not an object")
        serial, not_after = entry.get("serial"), entry.get("not_after")
        if not isinstance(serial, str) or not isinstance(not_after, str):
            raise DenyListFileError(f"{source}: an entry lacks 'serial' or 'not_after'")
        try:
            denied.append(DeniedSerial(serial, datetime.fromisoformat(not_after)))
        except (ValueError, InvalidName) as e:
            raise DenyListFileError(f"{source}: bad entry {serial!r}: {e}") from None
    return DenyList(denied)


class DenyListFile:
    """
    The deny-list kept in a state directory (blocking I/O: use a worker).
    The directory is created with mode 0700, the file written with 0600.
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / DENY_LIST_FILE

    def load(self) -> DenyList | None:
        """
        The kept deny-list, or L{None} when there is no file.

        @raise DenyListFileError: the file is not the documented format.
        @raise OSError: it cannot be read.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return parse_deny_list(raw, str(self.path))

    def store(self, deny_list: DenyList, saved_at: datetime) -> None:
        """Replace the file with C{deny_list}."""
        make_directories(self.path.parent)
        write_file_atomically(self.path, render_deny_list(deny_list, saved_at), 0o600)


class Revocations:
    """
    One server's deny-list; see the module docstring.

    @param file: where the list is kept.
    @param io: runs the file's reads and writes.
    @param clock: the server's time (ageing, C{saved_at}).
    @param install: makes a new list the one in force (the data-plane
        service's C{set_deny_list}); called with every change.
    """

    def __init__(
        self,
        file: DenyListFile,
        io: IWorker,
        clock: Seconds,
        install: Callable[[DenyList], object],
    ) -> None:
        self._file = file
        self._io = io
        self._clock = clock
        self._install = install
        self._current = DenyList()
        self._saved: DenyList | None = None
        self._lock = DeferredLock()

    @property
    def current(self) -> DenyList:
        """The deny-list in force."""
        return self._current

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock.seconds(), UTC)

    def merge(self, pushed: DenyList) -> Deferred[None]:
        """
        Merge C{pushed} into the list in force, dropping entries whose
        C{not_after} has passed, and install the result at once if it
        changed. Fires once the result is on disk (fails if it cannot be
        written; the merged list stays in force).
        """
        merged = self._current.merged(pushed).active(self._now())
        if merged != self._current:
            self._current = merged
            self._install(merged)
        return Deferred.fromCoroutine(self._save())

    async def _save(self) -> None:
        await self._lock.acquire()
        try:
            current = self._current
            if current == self._saved:
                return
            saved_at = self._now()
            await self._io.submit(lambda: self._file.store(current, saved_at))
            self._saved = current
        finally:
            self._lock.release()

    async def start(self, pull: PullRevocations | None) -> None:
        """
        Load the kept list and, with C{pull}, merge the control plane's
        current set; see the module docstring.

        @raise DenyListUnavailable: the kept list cannot be read and no
            pulled set replaces it.
        """
        path = str(self._file.path)
        unreadable: Exception | None = None
        try:
            kept = await self._io.submit(self._file.load)
        except (DenyListFileError, OSError) as e:
            kept, unreadable = None, e
            _log.error("cannot read the kept deny-list: {error}", error=str(e))
        if kept is not None:
            self._saved = kept
            await self.merge(kept)
            _log.info(
                "loaded {count} deny-list entries from {path}", count=len(self._current), path=path
            )
        if pull is None:
            if unreadable is not None:
                raise DenyListUnavailable(
                    f"{unreadable}; with no control plane to ask, remove or repair the file"
                )
            return
        try:
            pulled = await pull()
        except Exception as e:
            if unreadable is not None:
                raise DenyListUnavailable(
                    f"{unreadable}; and the control plane's revocation set could not be pulled: {e}"
                ) from None
            _log.warn(
                "could not pull the revocation set from the control plane ({error}); serving"
                " with the {count} deny-list entries kept in {path} until the next push",
                error=str(e) or type(e).__name__,
                count=len(self._current),
                path=path,
            )
            return
        await self.merge(pulled)
        _log.info(
            "pulled {pulled} revocations from the control plane; {count} deny-list entries",
            pulled=len(pulled),
            count=len(self._current),
        )
