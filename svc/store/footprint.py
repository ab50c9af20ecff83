"""
An agent's footprint on the data plane, and the limits that bound it by its
grant (``docs/specifications/storage-engine.md``, "Footprint").

Every chunk of a tenant's store is charged to an agent (the top-level
directory C{/<agent_id>} of its disk) in one of four parts until it leaves
the disk:

- B{live}: named by the agent's live files (C{subtree_usage});
- B{uncommitted}: uploaded by the agent (C{chunk_put}) and not yet named by
  one of its files;
- B{retained}: named only by the agent's journal rows (old versions kept so
  they can be reverted);
- B{collectable}: released by the agent's pruned journal rows or expired
  uploads, referenced by nothing, and waiting to be deleted.

With a grant C{g} and a retention factor C{r}:

- C{live <= g}: a commit that would pass it is C{EDQUOT}
  (L{svc.store.quota.QuotaExceeded}), unless it does not raise C{live};
- C{uncommitted <= g}: an upload that would pass it is C{EDQUOT} (apart
  from C{live}, so a full disk's files can still be rewritten: the new
  version's chunks are uploaded while the old version is live);
- C{retained <= floor(r * g)}: the change that passes it prunes the agent's
  oldest journal rows, in the same transaction, until it holds;
- C{collectable <= g} before an upload of new bytes is taken: past it, the
  upload waits for the tenant's reclaim pass.

So the footprint stays within C{(3 + r) * g} (L{FootprintPolicy.bound}).
Without a grant, the parts beyond the files (retained, collectable) are
bounded the same way by the server's default C{ungranted_bytes} in place of
C{g}; live and uncommitted bytes then only meet the account budget.

Everything here is pure; the rows are kept by L{svc.store.footprint_rows}.
"""

from __future__ import annotations

from fractions import Fraction

import attrs

#: The retention factor unless configured otherwise.
DEFAULT_RETENTION_FACTOR = Fraction(1)

#: The stand-in for a grant for agents without one: 1 GiB.
DEFAULT_UNGRANTED_BYTES = 1 << 30


def _non_negative_factor(
    _instance: object, attribute: attrs.Attribute[Fraction], value: Fraction
) -> None:
    if not isinstance(value, Fraction) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative Fraction, got {value!r}")


def _non_negative_int(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative integer, got {value!r}")


@attrs.frozen
class FootprintPolicy:
    """
    The server-wide settings of the footprint limits.

    @ivar retention_factor: C{r}: an agent's retained bytes stay within
        C{floor(r * g)} (C{SVC_RETENTION_FACTOR}).
    @ivar ungranted_bytes: the C{g} of the retained and collectable limits
        for an agent without a grant (C{SVC_UNGRANTED_FOOTPRINT_BYTES}).
    """

    retention_factor: Fraction = attrs.field(
        default=DEFAULT_RETENTION_FACTOR, validator=_non_negative_factor
    )
    ungranted_bytes: int = attrs.field(default=DEFAULT_UNGRANTED_BYTES, validator=_non_negative_int)

    def _base(self, grant_bytes: int | None) -> int:
        return self.ungranted_bytes if grant_bytes is None else grant_bytes

    def retained_cap(self, grant_bytes: int | None) -> int:
        """
        The most bytes an agent with this grant (L{None}: none) may keep
        only for its journal: C{floor(r * g)}.
        """
        factor = self.retention_factor
        return self._base(grant_bytes) * factor.numerator // factor.denominator

    def backlog_limit(self, grant_bytes: int | None) -> int:
        """
        The collectable bytes past which an agent's uploads of new bytes
        wait for the tenant's reclaim pass: C{g}.
        """
        return self._base(grant_bytes)

    def bound(self, grant_bytes: int | None) -> int | None:
        """
        The most an agent with this grant can have charged on the server,
        C{live + uncommitted + retained + collectable <= (3 + r) * g};
        L{None} without a grant (live and uncommitted bytes are then not
        bounded by the agent's own limits).
        """
        if grant_bytes is None:
            return None
        return 3 * grant_bytes + self.retained_cap(grant_bytes)


@attrs.frozen
class Footprint:
    """
    One agent's charged bytes, by part (see the module docstring).
    """

    live_bytes: int = 0
    uncommitted_bytes: int = 0
    retained_bytes: int = 0
    collectable_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """Everything charged to the agent."""
        return (
            self.live_bytes + self.uncommitted_bytes + self.retained_bytes + self.collectable_bytes
        )


class CollectionBacklog(Exception):
    """
    An upload of new bytes found the agent's collectable bytes past
    L{FootprintPolicy.backlog_limit}: nothing was charged; wait for the
    tenant's next reclaim pass and try again. Never reaches a client.
    """


def parse_factor(text: str) -> Fraction:
    """
    A retention factor written as a decimal number (C{1}, C{0.5}, C{2.25}),
    at most 1000 and with at most three decimals.

    @raise ValueError: anything else.
    """
    body = text.strip()
    whole, _, decimals = body.partition(".")
    if (
        not whole.isdigit()
        or not whole.isascii()
        or (decimals and (not decimals.isdigit() or not decimals.isascii()))
        or len(decimals) > 3
        or body.endswith(".")
    ):
        raise ValueError(f"not a decimal number with at most 3 decimals: {text!r}")
    value = Fraction(body)
    if value > 1000:
        raise ValueError(f"at most 1000, got {text!r}")
    return value
