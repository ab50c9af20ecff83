"""
An owner's account: the budget shared by every tenant of one owner, and the
byte reservations of the uploads in flight against it
(``docs/specifications/storage-engine.md``, "What counts", "When EDQUOT is
returned"). The engine
builds one per owner and gives it to each of the owner's tenant storages.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, DeferredLock, succeed

from svc.store.chunks import IChunkStore
from svc.store.quota import check_account


class OwnerAccount:
    """
    The account budget shared by every tenant of one owner, and the byte
    reservations of uploads in flight.

    Usage is the sum of the owner's chunk stores' totals (each chunk counted
    once per store). Uploads reserve their bytes before writing, under a
    lock, so two concurrent uploads cannot both squeeze under the budget.
    """

    def __init__(self, owner: str, budget_bytes: int | None) -> None:
        self.owner = owner
        self.budget_bytes = budget_bytes
        self._stores: list[IChunkStore] = []
        self._reserved = 0
        self._lock = DeferredLock()

    def add_store(self, store: IChunkStore) -> None:
        """
        Count ``store``'s bytes against this account.
        """
        self._stores.append(store)

    def used_bytes(self) -> Deferred[int]:
        """
        Bytes held by all of the owner's chunk stores now.
        """

        async def total() -> int:
            return sum([await store.total_bytes() for store in self._stores])

        return Deferred.fromCoroutine(total())

    def reserve(self, size: int) -> Deferred[None]:
        """
        Reserve ``size`` bytes of new chunk data, or fail with
        L{svc.store.errors.QuotaExceeded}. Every successful reservation must
        be followed by L{release} once the upload has finished either way.
        Without a budget nothing can be refused: the reservation is counted
        (a budget set meanwhile sees it) with no lock and no usage sum.
        """
        if self.budget_bytes is None:
            self._reserved += size
            return succeed(None)

        async def reserving() -> None:
            await self._lock.acquire()
            try:
                used = await self.used_bytes()
                check_account(used + self._reserved, size, self.budget_bytes)
                self._reserved += size
            finally:
                self._lock.release()

        return Deferred.fromCoroutine(reserving())

    def release(self, size: int) -> None:
        """
        Give back a reservation made by L{reserve}.
        """
        self._reserved -= size
