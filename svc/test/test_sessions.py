"""
Tests for L{svc.sessions}: minting, verifying and fencing mount session ids.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from svc.sessions import (
    MountSession,
    SessionBook,
    SessionRejected,
    SessionRejection,
    mint_session_id,
    parse_epoch,
    session_key,
    verify_session_id,
)

KEY = session_key("s" * 40)


def mint(epoch: int = 1, tenant: str = "t1", agent: str = "a1") -> str:
    return mint_session_id(KEY, tenant_id=tenant, agent_id=agent, epoch=epoch)


class SessionIdTests(SynchronousTestCase):
    """
    Session ids verify only for the tenant and agent they were minted for.
    """

    def reason(self, session_id: str, tenant: str = "t1", agent: str = "a1") -> SessionRejection:
        error = self.assertRaises(
            SessionRejected,
            verify_session_id,
            KEY,
            session_id,
            tenant_id=tenant,
            agent_id=agent,
        )
        reason: SessionRejection = error.reason
        return reason

    def test_round_trip(self) -> None:
        """A minted id verifies for its holder and carries its epoch."""
        session_id = mint(epoch=7)
        self.assertTrue(session_id.startswith("mount:"))
        self.assertEqual(len(session_id), len("mount:") + 64)
        session = verify_session_id(KEY, session_id, tenant_id="t1", agent_id="a1")
        self.assertEqual((session.epoch, session.agent_id), (7, "a1"))
        self.assertEqual(parse_epoch(session_id), 7)

    def test_bad_format(self) -> None:
        """Wrong prefix or length is bad_format."""
        good = mint()
        for bad in ("", "mount:", "lease:" + good[6:], good + "0", good[:-1], good.upper()):
            self.assertEqual(self.reason(bad), SessionRejection.BAD_FORMAT, bad)

    def test_bad_hex(self) -> None:
        """The right shape with non-hex characters is bad_hex."""
        good = mint()
        self.assertEqual(self.reason(good[:-1] + "g"), SessionRejection.BAD_HEX)
        self.assertEqual(self.reason("mount:" + "Z" * 64), SessionRejection.BAD_HEX)

    def test_wrong_holder(self) -> None:
        """Another agent or tenant, a flipped bit or another key: unknown_or_wrong_holder."""
        good = mint()
        self.assertEqual(self.reason(good, agent="a2"), SessionRejection.UNKNOWN_OR_WRONG_HOLDER)
        self.assertEqual(self.reason(good, tenant="t2"), SessionRejection.UNKNOWN_OR_WRONG_HOLDER)
        flipped = good[:-1] + ("0" if good[-1] != "0" else "1")
        self.assertEqual(self.reason(flipped), SessionRejection.UNKNOWN_OR_WRONG_HOLDER)
        other = mint_session_id(session_key("x" * 40), tenant_id="t1", agent_id="a1", epoch=1)
        self.assertEqual(self.reason(other), SessionRejection.UNKNOWN_OR_WRONG_HOLDER)
        # Changing the epoch digits breaks the tag too: epochs cannot be forged upward.
        bumped = "mount:" + f"{2:016x}" + good[6 + 16 :]
        self.assertEqual(self.reason(bumped), SessionRejection.UNKNOWN_OR_WRONG_HOLDER)


class SessionBookTests(SynchronousTestCase):
    """
    Older epochs are fenced once a newer one has been seen for the agent.
    """

    def session(self, epoch: int, agent: str = "a1") -> MountSession:
        return verify_session_id(
            KEY, mint(epoch=epoch, agent=agent), tenant_id="t1", agent_id=agent
        )

    def test_new_then_rebind_then_fenced(self) -> None:
        """A first epoch is new, the same epoch again is a rebind, an older one is fenced."""
        book = SessionBook()
        self.assertTrue(book.admit(self.session(3)))
        self.assertFalse(book.admit(self.session(3)))
        self.assertTrue(book.admit(self.session(4)))
        error = self.assertRaises(SessionRejected, book.admit, self.session(3))
        self.assertEqual(error.reason, SessionRejection.FENCED)

    def test_agents_independent(self) -> None:
        """One agent's newer epoch does not fence another agent."""
        book = SessionBook()
        book.admit(self.session(9, agent="a1"))
        self.assertTrue(book.admit(self.session(1, agent="a2")))
