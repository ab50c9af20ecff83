"""
Quotas: an account budget shared by every tenant of an owner, and a grant per
agent allocation.

What counts (see ``docs/specifications/storage-engine.md``, "What counts"):

- B{Account usage} is the number of bytes of distinct chunks held in all the
  chunk stores under the owner's directory. Chunks are content-addressed, so a
  chunk shared by two files, or uploaded twice, counts once. Chunks kept only
  by the journal's retention window, or uploaded and not yet committed, count
  until garbage collection removes them.
- B{Agent usage} is the number of bytes of distinct chunks referenced by the
  live files under the agent's subtree C{/<agent_id>}. The grant bounds it
  together with the agent's uploads not yet committed; the rest of the
  agent's footprint is bounded by L{svc.store.footprint}.

A put that would take either past its limit fails with C{EDQUOT}
(L{QuotaExceeded}) and writes nothing. C{None} means unlimited.

The checks here are pure; L{QuotaSettings} is the value persisted in the
quota files, read and written by L{svc.store.quota_files}; L{QuotaUsage} is
what an agent is told of its usage and limits (the C{statfs} operation).
"""

from __future__ import annotations

import attrs

from svc.store.errors import QuotaExceeded


def _non_negative_or_none(
    _instance: object, attribute: attrs.Attribute[int | None], value: int | None
) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"{attribute.name} must be a non-negative integer or None, got {value!r}")


@attrs.frozen
class QuotaSettings:
    """
    The limits that apply to one agent's writes: its owner's account budget and
    its own allocation grant, in bytes; C{None} is unlimited.
    """

    account_budget_bytes: int | None = attrs.field(default=None, validator=_non_negative_or_none)
    agent_grant_bytes: int | None = attrs.field(default=None, validator=_non_negative_or_none)


def check_account(used_bytes: int, adding_bytes: int, budget_bytes: int | None) -> None:
    """
    Refuse storing ``adding_bytes`` of new chunk data when the account, already
    holding ``used_bytes``, would go past ``budget_bytes``. Reaching the budget
    exactly is allowed.
    """
    if budget_bytes is None or adding_bytes <= 0:
        return
    if used_bytes + adding_bytes > budget_bytes:
        raise QuotaExceeded(
            f"account budget {budget_bytes} bytes: {used_bytes} used, "
            f"{adding_bytes} more would exceed it"
        )


def check_grant(usage_after_bytes: int, usage_before_bytes: int, grant_bytes: int | None) -> None:
    """
    Refuse a change that leaves an agent's usage at ``usage_after_bytes`` when
    that is over ``grant_bytes``. A change that does not increase usage is
    always allowed, so an agent over its grant (after the grant was lowered) can
    still delete and shrink files.
    """
    if grant_bytes is None or usage_after_bytes <= usage_before_bytes:
        return
    if usage_after_bytes > grant_bytes:
        raise QuotaExceeded(
            f"agent grant {grant_bytes} bytes: the change needs {usage_after_bytes}"
        )


def available_bytes(
    used_bytes: int,
    grant_bytes: int | None,
    account_used_bytes: int | None,
    budget_bytes: int | None,
) -> int | None:
    """
    How many more bytes an agent may store: the smaller of the room left
    under its grant (C{grant - used}) and under its owner's account budget
    (C{budget - account_used}), over the limits that exist, never below 0;
    L{None} when neither limit exists (the account usage counts only with a
    budget).
    """
    room = []
    if grant_bytes is not None:
        room.append(grant_bytes - used_bytes)
    if budget_bytes is not None and account_used_bytes is not None:
        room.append(budget_bytes - account_used_bytes)
    return max(0, min(room)) if room else None


@attrs.frozen
class QuotaUsage:
    """
    One agent's usage and the limits on it, in bytes, as the quota checks
    count them: C{used_bytes} is the agent usage, C{account_used_bytes} the
    account usage of its owner (every agent's, every tenant's), known only
    when the account has a budget (L{None} otherwise); a limit of C{None} is
    unlimited.

    The rest of the agent's footprint (L{svc.store.footprint}):
    C{uncommitted_bytes} uploaded and not yet named by its files (the grant
    bounds them with C{used_bytes}), C{retained_bytes} kept only for its
    journal (at most C{retained_cap_bytes}), C{collectable_bytes} released
    and waiting for deletion; C{footprint_bound_bytes} is the most all four
    parts can reach (L{None} without a grant).
    """

    used_bytes: int
    grant_bytes: int | None
    account_used_bytes: int | None
    budget_bytes: int | None
    uncommitted_bytes: int = 0
    retained_bytes: int = 0
    collectable_bytes: int = 0
    retained_cap_bytes: int | None = None
    footprint_bound_bytes: int | None = None

    @property
    def available_bytes(self) -> int | None:
        """
        See L{available_bytes}: the room under the grant is what the files
        leave. Uploads not yet committed take room too (the grant bounds
        them with the files) but are not subtracted: a client writing a file
        counts its own uploads already (the mount's write-time check), and
        may subtract C{uncommitted_bytes} itself.
        """
        return available_bytes(
            self.used_bytes, self.grant_bytes, self.account_used_bytes, self.budget_bytes
        )
