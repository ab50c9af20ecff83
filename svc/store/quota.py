"""
Quotas: an account budget shared by every tenant of an owner, and a grant per
agent allocation.

What counts (see ``docs/specifications/quota.md``):

- B{Account usage} is the number of bytes of distinct chunks held in all the
  chunk stores under the owner's directory. Chunks are content-addressed, so a
  chunk shared by two files, or uploaded twice, counts once. Chunks kept only
  by the journal's retention window, or uploaded and not yet committed, count
  until garbage collection removes them.
- B{Agent usage} is the number of bytes of distinct chunks referenced by the
  live files under the agent's subtree C{/<agent_id>}.

A put that would take either past its limit fails with C{EDQUOT}
(L{QuotaExceeded}) and writes nothing. C{None} means unlimited.

The checks here are pure; L{QuotaSettings} is the value persisted in the
quota files, read and written by L{svc.store.quota_files}.
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
