"""
Single use under real concurrency: several enrollments with one token, sent
at once over loopback HTTP to a control plane on the real reactor, with the
SQLite store in a file on its own worker thread and the filesystem CA on
another. At most one leaf may be minted.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import treq
from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.trial.unittest import TestCase
from twisted.web.client import HTTPConnectionPool
from twisted.web.server import Site

from svc.control.app import build_control_app
from svc.control.ca import AgentCAProvider, init_org_root
from svc.control.enrollment import EnrollmentDeps, hash_token, new_secret_token
from svc.control.routes_enrollment import enrollment_authenticators, enrollment_routes
from svc.control.settings import ControlSettings
from svc.control.store.opening import open_store
from svc.control.test.test_enrollment_support import control_environ
from svc.testing.control_store import TEST_SESSION_KEY
from svc.worker import ThreadWorker

CONCURRENT = 6
reactor: Any = global_reactor


class ConcurrentEnrollmentTests(TestCase):
    """Concurrent uses of one enroll token against the real SQLite store."""

    async def test_one_token_one_leaf(self) -> None:
        """Of several simultaneous enrollments with one token exactly one is 200, the rest 401."""
        base = Path(self.mktemp()).absolute()
        base.mkdir()
        url = f"sqlite:///{base}/control.db"
        settings = ControlSettings.from_environ(
            control_environ(base / "secrets", DATABASE_URL=url, SVC_ENROLL_RATE_LIMIT="100/60")
        )
        store = await open_store(url, reactor, session_key=TEST_SESSION_KEY)
        self.addCleanup(store.close)
        worker = ThreadWorker(reactor, "test-ca", threads=2)
        self.addCleanup(worker.stop)
        now = datetime.fromtimestamp(reactor.seconds(), UTC)
        await init_org_root(settings, store, now, worker)
        await store.register_server("dataplane.test", "127.0.0.1:7443", 5, now)
        provisioned = await store.provision(
            agent_id="agent-1", owner_id="alice", tenant_id="acme", grant_bytes=1, now=now
        )
        token = new_secret_token()
        await store.create_enroll_token(
            provisioned.allocation.allocation_id, hash_token(token), now, now + timedelta(hours=1)
        )

        provider = await AgentCAProvider.opened(settings, store, worker)
        deps = EnrollmentDeps.build(store, provider, settings, reactor.seconds)
        app = build_control_app(
            settings,
            reactor.seconds,
            routes=enrollment_routes(deps),
            authenticators=enrollment_authenticators(deps),
        )
        port = reactor.listenTCP(0, Site(app.resource()), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(pool.closeCachedConnections)
        address = f"http://127.0.0.1:{port.getHost().port}/agent/enroll"

        async def enroll() -> tuple[int, dict[str, object]]:
            headers: dict[bytes | str, bytes | str] = {"Authorization": f"Bearer {token}"}
            response = await treq.post(address, headers=headers, pool=pool)
            return response.code, json.loads(await response.content())

        answers = await gatherResults([Deferred.fromCoroutine(enroll()) for _ in range(CONCURRENT)])
        codes = sorted(code for code, _ in answers)
        self.assertEqual(codes, [200] + [401] * (CONCURRENT - 1))
        leaves = [body for code, body in answers if code == 200]
        issued = await store.find_certificate(str(leaves[0]["serial"]))
        self.assertEqual(issued.agent_id, "agent-1")
