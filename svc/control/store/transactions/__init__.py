"""
The store's operations, each written once as a
L{svc.control.store.sql.Transaction} and run unchanged by the SQLite and the
PostgreSQL implementation: L{accounts} (users, tenants, allocations),
L{credentials} (enroll tokens, API tokens, admin sessions), L{mounts} (mount
leases, revocations, issued certificates) and L{fleet} (servers, placement,
CA material).
"""
