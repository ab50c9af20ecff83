"""
The mount client's service: start-up, lease and certificate upkeep, and
shutdown of one mount (L{MountService}; ``twist svc-mount`` builds it in
L{svc.mount.tap}).

Start-up (``docs/specifications/mount-runtime.md``): enroll, take the mount
lease, connect to the data plane and wait for HELLO, open the chunk cache,
start L{MountFS}, then mount it with llfuse, whose loop runs in a thread of
its own (twist owns the main thread for the reactor; see
L{svc.mount.runtime.runner}). Shutdown (SIGTERM/SIGINT through twist): write back
every open file, unmount, release the lease, close the connection.

A failure while starting ends the process with status 1, in one line
naming the variable or resource at fault (L{svc.startup}).
"""

from __future__ import annotations

import signal
from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from svc.audit.client_events import enrollment_event
from svc.audit.events import AuditEvent
from svc.audit.sink import AuditLogService, InstallSignal, JsonlAuditSink
from svc.dataplane_client.client import DataPlaneClient, connect_dataplane
from svc.dataplane_client.reconnecting import ReconnectingClient, ReconnectPolicy
from svc.mount.chunks.cache import ChunkCache
from svc.mount.chunks.cached_chunks import CachedChunks
from svc.mount.control.control_client import LeaseLost, MountControlClient, Revoked
from svc.mount.control.start_retry import refused_at_start, until_answered
from svc.mount.fs import MountFS
from svc.mount.outbox.outbox import Outbox
from svc.mount.outbox.replay import open_outbox
from svc.mount.remote.data_plane import Remote
from svc.mount.remote.pushes import changed_pushes, fenced_pushes, revoked_pushes
from svc.mount.remote.quota_source import QuotaSource
from svc.mount.remote.write_leases import revoke_pushes
from svc.mount.runtime.bridge import Bridge
from svc.mount.runtime.kernel_notices import KernelNotices
from svc.mount.runtime.reactor_caller import ReactorCaller
from svc.mount.runtime.runner import FuseLoop
from svc.mount.runtime.settings import MountSettings
from svc.mount.writeback.shutdown_sync import sync_all
from svc.mount.writeback.unsent import UnsentFiles, copies_in
from svc.pki import names
from svc.policy import UNRESTRICTED, load_policy_file
from svc.sessions import parse_epoch
from svc.startup import blame, end_start
from svc.worker import ThreadWorker

_log = Logger()

_CACHE_FIX = "make it a directory this user may create and write"

RENEW_AT = 2 / 3
"""Renew the agent certificate at this fraction of its remaining life."""


def agent_id_of(leaf: Any) -> str:
    """The agent id in a leaf's C{spiffe://<domain>/agent/<id>} SAN."""

    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        parts = names.split_spiffe_id(uri)
        if parts is not None and parts[1].startswith("agent/"):
            return parts[1].removeprefix("agent/")
    raise ValueError("the agent certificate names no agent")


class MountService(Service):
    """The whole mount client: see the module docstring."""

    def __init__(
        self,
        reactor: Any,
        settings: MountSettings,
        *,
        install_signal: InstallSignal | None = signal.signal,
        exit_on_failure: bool = True,
    ) -> None:
        """
        @param install_signal: installs the SIGHUP handler that reopens the
            audit log (L{None}: none).
        @param exit_on_failure: end the process when the start fails.
        """
        self._reactor = reactor
        self._settings = settings
        self._install_signal = install_signal
        self._exit_on_failure = exit_on_failure
        self._stopping = False
        self._timers: list[Any] = []
        self._fs: Any = None
        self._bridge: Any = None
        self._loop: Any = None
        self._control: Any = None
        self._creds: Any = None
        self._dataplane: Any = None
        self._cache: Any = None
        self._audit: AuditLogService | None = None
        self._worker: Any = None
        self._spill_worker: Any = None
        self._cache_worker: Any = None
        self._session_epoch: int | None = None
        self._outbox: Outbox | None = None
        self.ready: Deferred[None] = Deferred()
        self.started: Deferred[None] | None = None
        """The start (set by C{startService}): fires once mounted, or fails."""

    def _emit(self, event: AuditEvent) -> None:
        if self._audit is not None:
            self._audit.sink.emit(event)

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.started = Deferred.fromCoroutine(self._start())

        def done(result: object) -> object:
            if not isinstance(result, Failure):
                self.ready.callback(None)
                return result
            if not self._exit_on_failure:
                return result
            if not self._stopping:
                # After the services stopped (unmounting whatever was
                # mounted), end with a failure status instead of twist's 0.
                end_start(self._reactor, "svc-mount", result)
            return None

        self.started.addBoth(done)

    async def _start(self) -> None:

        settings = self._settings
        reactor = self._reactor
        with blame("SVC_CACHE_DIR", _CACHE_FIX):
            for directory in (settings.chunk_dir, settings.spill_dir):
                directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            left = copies_in(settings.unsent_dir)
        if left:
            _log.warn(
                "{count} copies of changes an earlier run did not write back are in {folder}"
                " (operator guide, section 4)",
                count=left,
                folder=str(settings.unsent_dir),
            )
        with blame("SVC_POLICY_FILE"):
            policy = (
                load_policy_file(settings.policy_file) if settings.policy_file else UNRESTRICTED
            )
        if settings.audit_log is not None:
            self._audit = AuditLogService(
                JsonlAuditSink(settings.audit_log, reactor),
                reactor=reactor,
                install_signal=self._install_signal,
            )
            with blame("SVC_AUDIT_LOG", "its directory must exist and be writable by this user"):
                self._audit.startService()
        self._worker = ThreadWorker(reactor, "svc-mount-worker", threads=2)
        # Spill I/O on threads of its own: an application's write is a short
        # pwrite that must not wait behind the write-behind's chunking.
        self._spill_worker = ThreadWorker(reactor, "svc-mount-spill", threads=2)
        # The chunk cache's disk steps run one at a time, in submission order
        # (its index connection and its table-before-disk ordering need it).
        self._cache_worker = ThreadWorker(reactor, "svc-mount-cache", threads=1)

        creds, lease, agent_id = await self._enroll_and_lease()
        self._session_epoch = parse_epoch(lease.session_id)
        self._schedule_refresh(lease.ttl_seconds)
        self._schedule_renewal()

        self._dataplane = dataplane = ReconnectingClient(
            reactor,
            self._connect_dataplane,
            policy=ReconnectPolicy(start_wait=self._settings.start_wait),
        )
        with blame(
            f"the data plane at {creds.server_addr}",
            "check that the data-plane server the control plane placed this agent on runs"
            " and is reachable from here",
        ):
            await self._dataplane.start()
        remote = Remote(self._dataplane)
        with blame("SVC_CACHE_DIR", _CACHE_FIX):
            self._cache = await ChunkCache.open(
                settings.chunk_dir, self._cache_worker, reactor, emit=self._emit
            )
        self._outbox = await self._replay_outbox(remote, lease.session_id)
        # Every change the filesystem sends is recorded in the outbox first.
        remote = Remote(self._dataplane, recorder=self._outbox)
        notices = KernelNotices(lambda: self._loop is not None and self._loop.running)
        quota = QuotaSource(remote.statfs, reactor)
        self._fs = MountFS(
            remote=remote,
            chunks=CachedChunks(self._cache, remote.chunk_get),
            agent_id=agent_id,
            session_id=lease.session_id,
            spill_dir=settings.spill_dir,
            unsent_dir=settings.unsent_dir,
            worker=self._worker,
            spill_worker=self._spill_worker,
            now=reactor.seconds,
            clock=reactor,
            emit=self._emit,
            policy=policy,
            invalidate=notices.invalidate,
            invalidate_entry=notices.invalidate_entry,
            forget_attributes=notices.forget_attributes,
            quota=quota,
            connected=lambda: dataplane.connected,
            settings=settings.fs_settings,
            outbox=self._outbox,
        )
        await self._fs.start()
        # The owner's reverts and other connections of this agent: forget
        # what they changed (mount-consistency.md section 7).
        self._dataplane.on_push(changed_pushes(self._fs.outside_changed))
        # Write leases asked back: write the file back, then yield.
        self._dataplane.on_push(revoke_pushes(self._fs.lease_revoked))
        # The certificate revoked (lease released or taken over, allocation
        # revoked): read-only at once, and no reconnection with it.
        self._dataplane.on_push(revoked_pushes(self._credentials_revoked))
        # The lease granted again elsewhere (a forced takeover): read-only at
        # once, still reading (the data plane refuses this session's writes).
        self._dataplane.on_push(fenced_pushes(self._session_fenced))
        # A lost connection took the leases with it: ask for them again now.
        self._dataplane.on_reconnect(self._fs.reconnected)
        self._bridge = Bridge(self._fs, ReactorCaller(reactor), settings.timeouts)
        self._loop = FuseLoop(
            reactor,
            self._bridge,
            settings.mount_point,
            workers=settings.workers,
            allow_other=settings.allow_other,
        )
        with blame("SVC_MOUNT_POINT", "check that FUSE works here (/dev/fuse, fusermount)"):
            self._loop.mount()
        self._loop.ended.addCallback(self._loop_ended)

    async def _replay_outbox(self, remote: Remote, session_id: str) -> Outbox:
        """
        Open the cache's outbox and send what a killed run left in it,
        before the disk is served (``mount-outbox.md`` section 8).
        """
        reactor = self._reactor
        unsent = UnsentFiles(self._settings.unsent_dir, self._worker, reactor.seconds)
        with blame("SVC_CACHE_DIR", _CACHE_FIX):
            outbox, replaying = open_outbox(
                self._settings.outbox_dir,
                remote,
                reactor,
                reactor.seconds,
                session_id,
                unsent,
                reactor.callFromThread,
            )
        await replaying
        return outbox

    async def _enroll_and_lease(self) -> tuple[Any, Any, str]:
        """Enroll (spending the token) and take the mount lease."""
        settings = self._settings
        reactor = self._reactor
        self._control = MountControlClient(reactor, settings.control_url, ca_file=settings.ca_file)
        control = self._control
        try:
            creds = await until_answered(
                reactor,
                "enrollment",
                lambda: control.enroll(settings.enroll_token),
                wait=settings.start_wait,
            )
        except Exception as error:
            self._emit(enrollment_event(ts=reactor.seconds(), serial=None))
            raise refused_at_start(
                "enrollment", error, settings.control_url, settings.start_wait
            ) from error
        self._emit(enrollment_event(ts=reactor.seconds(), serial=creds.serial))
        self._creds = creds
        agent_id = agent_id_of(creds.leaf())
        _log.info("enrolled as agent {agent}, serial {serial}", agent=agent_id, serial=creds.serial)
        try:
            lease = await until_answered(
                reactor,
                "mount lease",
                lambda: control.acquire_mount(creds, force=settings.force),
                wait=settings.start_wait,
            )
        except Exception as error:
            raise refused_at_start(
                "mount lease", error, settings.control_url, settings.start_wait
            ) from error
        _log.info(
            "mount lease held until {until} (session {session})",
            until=lease.lease_expires_at.isoformat(),
            session=lease.session_id,
        )
        return creds, lease, agent_id

    def _connect_dataplane(self) -> Deferred[DataPlaneClient]:
        """A new data-plane connection with the current certificate and server address."""
        host, _, port = self._creds.server_addr.rpartition(":")
        return connect_dataplane(self._reactor, (host, int(port)), self._creds.client_tls())

    def _loop_ended(self, result: object) -> None:
        if not self._stopping:
            _log.warn("the mount was unmounted from outside ({result}); stopping", result=result)
            self._reactor.stop()

    # Lease and certificate upkeep

    def _credentials_revoked(self, serial: str) -> None:
        """
        The data plane says this mount's certificate is revoked: every
        write fails EROFS from now on, and no call waits for a connection
        it would never admit (``mount-runtime.md`` section 6).
        """
        if self._stopping:
            # The mount released its own lease: the revocation is its own doing.
            _log.info(
                "the data plane closed this mount's connection after its lease was released"
                " (certificate serial {serial})",
                serial=serial,
            )
        reason = (
            f"the data plane revoked this mount's certificate (serial {serial}): its mount"
            " lease was released or taken over, or its allocation revoked"
        )
        if self._fs is not None and not self._stopping:
            self._fs.set_read_only(reason)
        if self._dataplane is not None:
            self._dataplane.close(reason)

    def _session_fenced(self, epoch: int) -> None:
        """
        The data plane fenced this agent's sessions older than C{epoch}: if
        this mount's is one, its lease was granted elsewhere (a forced
        takeover), so every write fails EROFS from now on; reads go on.
        """
        if self._fs is None or self._session_epoch is None or self._session_epoch >= epoch:
            return
        self._fs.set_read_only(
            f"another mount took this disk's lease over (epoch {epoch}, this mount's"
            f" {self._session_epoch}): the data plane refuses this mount's writes"
        )

    def _schedule_refresh(self, ttl_seconds: float) -> None:
        delay = max(1.0, ttl_seconds / 3)
        self._timers.append(self._reactor.callLater(delay, self._refresh))

    def _refresh(self) -> None:

        async def refreshing() -> None:
            try:
                lease = await self._control.refresh_mount(self._creds)
            except (LeaseLost, Revoked) as error:
                what = "mount lease lost" if isinstance(error, LeaseLost) else "allocation revoked"
                reason = f"{what}: {error}"
                _log.error("{reason}; the mount is read-only from now on", reason=reason)
                if self._fs is not None:
                    self._fs.set_read_only(reason)
                return
            except Exception as error:
                _log.warn("mount lease refresh failed, retrying: {error}", error=error)
                self._schedule_refresh(30.0)
                return
            self._schedule_refresh(lease.ttl_seconds)

        if not self._stopping:
            Deferred.fromCoroutine(refreshing())

    def _schedule_renewal(self) -> None:
        remaining = (self._creds.not_after - datetime.now(UTC)).total_seconds()
        delay = max(60.0, remaining * RENEW_AT)
        self._timers.append(self._reactor.callLater(delay, self._renew))

    def _renew(self) -> None:
        async def renewing() -> None:
            try:
                self._creds = await self._control.renew(self._creds)
                _log.info("agent certificate renewed, serial {serial}", serial=self._creds.serial)
                # The server ends connections admitted with the old leaf when
                # it expires: move to one admitted with the new leaf now.
                if self._dataplane is not None and await self._dataplane.switch():
                    _log.info("data-plane connection moved to the renewed certificate")
            except Exception as error:
                _log.warn("certificate renewal failed, retrying: {error}", error=error)
            self._schedule_renewal()

        if not self._stopping:
            Deferred.fromCoroutine(renewing())

    # Shutdown

    def stopService(self) -> Deferred[None]:
        super().stopService()  # type: ignore[no-untyped-call]
        self._stopping = True
        for timer in self._timers:
            if timer.active():
                timer.cancel()
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:

        if self._fs is not None and self._bridge is not None:
            failed = await sync_all(self._fs, self._bridge.open_handles())
            _log.info("wrote back open files before unmounting ({failed} failed)", failed=failed)
        if self._fs is not None:
            self._fs.stop_leases()
        if self._loop is not None:
            await self._loop.unmount()
        if self._creds is not None and self._control is not None:
            try:
                await self._control.release_mount(self._creds)
                _log.info("mount lease released")
            except Exception as error:
                _log.warn("could not release the mount lease: {error}", error=error)
        if self._outbox is not None:
            self._outbox.stop()
        if self._dataplane is not None:
            await self._dataplane.close()
        if self._cache is not None:
            await self._cache.close()
        if self._audit is not None:
            await self._audit.stopService()


__all__ = ["MountService", "agent_id_of"]
