"""
One tenant storage's agent grants and what follows from them
(``docs/specifications/storage-engine.md``, "What counts", "Footprint"):
the grants in memory (the engine persists them in C{grants.json}), the
bytes each agent may keep only for its journal (its retained cap under the
L{svc.store.footprint.FootprintPolicy}), brought within a lowered grant at
once, and the usage an agent is told of (L{svc.store.quota.QuotaUsage},
the C{statfs} operation).
"""

from __future__ import annotations

from collections.abc import Mapping

from twisted.internet.defer import Deferred

from svc.store.footprint import FootprintPolicy
from svc.store.journal_notices import JournalNotices
from svc.store.manifests import ManifestStore
from svc.store.owner_account import OwnerAccount
from svc.store.quota import QuotaUsage


class AgentGrants:
    """
    The agent grants of one tenant. Built by
    L{svc.store.tenant.TenantStorage}.

    @param grants: the grants read from C{grants.json}, by agent id
        (changed in place).
    @param journal: told of the disks whose journal a lowered grant pruned.
    """

    def __init__(
        self,
        grants: dict[str, int],
        policy: FootprintPolicy,
        manifests: ManifestStore,
        account: OwnerAccount,
        journal: JournalNotices,
    ) -> None:
        self._grants = grants
        self._policy = policy
        self._manifests = manifests
        self._account = account
        self._journal = journal

    @property
    def by_agent(self) -> Mapping[str, int]:
        """The grants now, by agent id (agents without one are unlimited)."""
        return self._grants

    def grant_for(self, agent_id: str) -> int | None:
        """
        The agent's grant in bytes (C{None}: unlimited).
        """
        return self._grants.get(agent_id)

    def set_grant(self, agent_id: str, grant_bytes: int | None) -> Deferred[None]:
        """
        Change the in-memory grant (the engine persists it) and bring the
        agent's retained bytes within the cap the new grant gives.
        """
        if grant_bytes is None:
            self._grants.pop(agent_id, None)
        else:
            self._grants[agent_id] = grant_bytes

        def enforced(collectable: int) -> None:
            self._journal.changed(agent_id)

        return self._manifests.enforce_retained_cap(
            agent_id, self._policy.retained_cap(grant_bytes)
        ).addCallback(enforced)

    def forget(self, agent_id: str) -> None:
        """The agent's disk was purged: forget its grant."""
        self._grants.pop(agent_id, None)

    def retained_cap(self, top: str) -> int:
        """
        The bytes the agent of disk ``top`` may keep only for its journal
        (L{FootprintPolicy.retained_cap}).
        """
        return self._policy.retained_cap(self._grants.get(top))

    def quota_usage(self, agent_id: str) -> Deferred[QuotaUsage]:
        """
        The agent's usage (its footprint, by part) and grant with its
        owner's account usage and budget
        (L{svc.store.tenant.TenantStorage.quota_usage}).
        """

        async def usage() -> QuotaUsage:
            footprint = await self._manifests.footprint(agent_id)
            # The account's usage moves when an upload is new to the tenant
            # store and not when it is not: shown without need, it would
            # tell agents what other agents stored (dataplane-ops.md 6).
            budget = self._account.budget_bytes
            account_used = None if budget is None else await self._account.used_bytes()
            grant = self.grant_for(agent_id)
            return QuotaUsage(
                used_bytes=footprint.live_bytes,
                grant_bytes=grant,
                account_used_bytes=account_used,
                budget_bytes=budget,
                uncommitted_bytes=footprint.uncommitted_bytes,
                retained_bytes=footprint.retained_bytes,
                collectable_bytes=footprint.collectable_bytes,
                retained_cap_bytes=self._policy.retained_cap(grant),
                footprint_bound_bytes=self._policy.bound(grant),
            )

        return Deferred.fromCoroutine(usage())
