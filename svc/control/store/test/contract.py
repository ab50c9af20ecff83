"""
L{ControlStoreContractMixin}: the behaviour every
L{svc.control.store.interface.ControlStore} must have.

Mix it into a L{twisted.trial.unittest.TestCase} (the tests are
asynchronous: PostgreSQL needs the real reactor) and implement the hooks of
L{svc.control.store.test.contract_support.StoreCase}: C{open_store},
C{tamper} and C{stored_text}.
"""

from __future__ import annotations

from svc.control.store.test.contract_accounts import AccountsContract
from svc.control.store.test.contract_credentials import CredentialsContract
from svc.control.store.test.contract_fleet import FleetContract
from svc.control.store.test.contract_mounts import MountsContract, RenewalChainContract
from svc.control.store.test.contract_revocation import AgentRevocationContract


class ControlStoreContractMixin(
    AccountsContract,
    CredentialsContract,
    MountsContract,
    RenewalChainContract,
    AgentRevocationContract,
    FleetContract,
):
    """Every contract test, for one implementation."""
