"""
Transactions over the data-plane fleet: registered servers, sticky tenant
placement, and CA material for the in-database secrets backend.
"""

# Statements below interpolate only this package's constant column lists and
# fixed clauses; every value goes through a parameter.
# ruff: noqa: S608

from __future__ import annotations

from svc.control.store.errors import NotFound, ServerKeyConflict
from svc.control.store.outcomes import InsufficientCapacity, PlacementOutcome
from svc.control.store.rules import choose_server
from svc.control.store.sql import Rows, Sql, Transaction, as_int, as_str
from svc.control.store.transactions import rows
from svc.control.store.values import CaKind, CaMaterial, Placement, Server, to_micros

_SELECT_SERVER = f"SELECT {rows.SERVER_COLUMNS} FROM servers"


def register_server(
    server_id: str,
    fqdn: str,
    address: str,
    capacity: int,
    now_us: int,
    cert_serial: str | None,
    cert_not_after_us: int | None,
    http_address: str | None,
    identity_key: str | None = None,
    replacing: str | None = None,
) -> Transaction[Server]:
    """
    Register the server C{fqdn}, or update its address, capacity, last-seen
    time and (when given) certificate, HTTPS address and identity key.
    C{server_id} is used only for a new registration; a known FQDN keeps its
    id and placements.

    A known FQDN whose stored identity key differs from C{identity_key} is
    left unchanged and L{ServerKeyConflict} raised, unless C{replacing}
    names the stored key; a stored key of L{None} is claimed. The check is
    the upsert's own condition, so two servers registering one new FQDN at
    once cannot both have it.
    """
    found: Rows = yield Sql(
        f"INSERT INTO servers ({rows.SERVER_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (fqdn) DO UPDATE SET address = excluded.address,"
        " capacity = excluded.capacity, last_seen_us = excluded.last_seen_us,"
        " cert_serial = COALESCE(excluded.cert_serial, servers.cert_serial),"
        " cert_not_after_us = COALESCE(excluded.cert_not_after_us, servers.cert_not_after_us),"
        " http_address = COALESCE(excluded.http_address, servers.http_address),"
        " identity_key = COALESCE(excluded.identity_key, servers.identity_key)"
        " WHERE excluded.identity_key IS NULL OR servers.identity_key IS NULL"
        " OR servers.identity_key = excluded.identity_key OR servers.identity_key = ?"
        f" RETURNING {rows.SERVER_COLUMNS}",
        (
            server_id,
            fqdn,
            address,
            capacity,
            now_us,
            now_us,
            cert_serial,
            cert_not_after_us,
            http_address,
            identity_key,
            replacing,
        ),
    )
    row = found.one()
    if row is None:
        stored: Rows = yield Sql(f"{_SELECT_SERVER} WHERE fqdn = ?", (fqdn,))
        raise ServerKeyConflict(rows.server(stored.only()))
    return rows.server(row)


def touch_server(fqdn: str, now_us: int) -> Transaction[Server]:
    """Set the last-seen time of server C{fqdn} (L{NotFound} if unknown)."""
    found: Rows = yield Sql(
        f"UPDATE servers SET last_seen_us = ? WHERE fqdn = ? RETURNING {rows.SERVER_COLUMNS}",
        (now_us, fqdn),
    )
    row = found.one()
    if row is None:
        raise NotFound(f"no server {fqdn}")
    return rows.server(row)


def list_servers() -> Transaction[tuple[Server, ...]]:
    """Every registered server, by FQDN."""
    found: Rows = yield Sql(f"{_SELECT_SERVER} ORDER BY fqdn")
    return tuple(rows.server(row) for row in found.rows)


_SELECT_PLACEMENT = (
    "SELECT p.tenant_id, p.placed_us, "
    + ", ".join(f"s.{column.strip()}" for column in rows.SERVER_COLUMNS.split(","))
    + " FROM tenant_placements p JOIN servers s ON s.server_id = p.server_id"
)


def _placement(row: tuple[object, ...]) -> Placement:
    return Placement(as_str(row[0]), rows.server(row[2:]), rows.at(row[1]))


def get_placement(tenant_id: str) -> Transaction[Placement | None]:
    """Where tenant C{tenant_id} lives, if it has been placed."""
    found: Rows = yield Sql(f"{_SELECT_PLACEMENT} WHERE p.tenant_id = ?", (tenant_id,))
    row = found.one()
    return None if row is None else _placement(row)


def list_placements() -> Transaction[tuple[Placement, ...]]:
    """Every placement made, by tenant id."""
    found: Rows = yield Sql(f"{_SELECT_PLACEMENT} ORDER BY p.tenant_id")
    return tuple(_placement(row) for row in found.rows)


def place_tenant(tenant_id: str, now_us: int) -> Transaction[PlacementOutcome]:
    """
    Tenant C{tenant_id}'s placement: the existing one (placement is sticky),
    or a new one on the least-loaded server with spare capacity
    (L{svc.control.store.rules.choose_server}), or L{InsufficientCapacity}.
    Every new placement locks every server row first, so concurrent
    placements never overfill a server (L{NotFound} if no such tenant).
    """
    placed = yield from get_placement(tenant_id)
    if placed is not None:
        return placed
    tenants: Rows = yield Sql("SELECT tenant_id FROM tenants WHERE tenant_id = ?", (tenant_id,))
    if not tenants.rows:
        raise NotFound(f"no tenant {tenant_id}")
    found: Rows = yield Sql(f"{_SELECT_SERVER} ORDER BY server_id", lock=True)
    servers = tuple(rows.server(row) for row in found.rows)
    placed = yield from get_placement(tenant_id)
    if placed is not None:
        return placed
    counted: Rows = yield Sql(
        "SELECT server_id, count(*) FROM tenant_placements GROUP BY server_id"
    )
    loads = {as_str(row[0]): as_int(row[1]) for row in counted.rows}
    chosen = choose_server(servers, loads)
    if chosen is None:
        return InsufficientCapacity(tenant_id)
    yield Sql(
        "INSERT INTO tenant_placements (tenant_id, server_id, placed_us) VALUES (?, ?, ?)"
        " ON CONFLICT (tenant_id) DO NOTHING",
        (tenant_id, chosen.server_id, now_us),
    )
    placed = yield from get_placement(tenant_id)
    assert placed is not None
    return placed


def _ca_id(kind: CaKind, tenant_id: str | None) -> str:
    return "root" if kind is CaKind.ROOT else f"tenant/{tenant_id}"


def get_ca_material(kind: CaKind, tenant_id: str | None) -> Transaction[CaMaterial | None]:
    """The stored root (C{tenant_id} L{None}) or tenant CA material, if any."""
    found: Rows = yield Sql(
        f"SELECT {rows.CA_COLUMNS} FROM ca_material WHERE ca_id = ?",
        (_ca_id(kind, tenant_id),),
    )
    row = found.one()
    return None if row is None else rows.ca_material(row)


def put_ca_material(material: CaMaterial, replace: bool) -> Transaction[CaMaterial]:
    """
    Store C{material}. Without C{replace} an existing record for the same
    CA wins (two processes creating one intermediate at once agree on the
    first); either way the stored record is returned.
    """
    action = (
        "DO UPDATE SET cert_pem = excluded.cert_pem,"
        " encrypted_key_pem = excluded.encrypted_key_pem, created_us = excluded.created_us"
        if replace
        else "DO NOTHING"
    )
    yield Sql(
        f"INSERT INTO ca_material (ca_id, {rows.CA_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
        f" ON CONFLICT (ca_id) {action}",
        (
            _ca_id(material.kind, material.tenant_id),
            material.kind.value,
            material.tenant_id,
            material.cert_pem,
            material.encrypted_key_pem,
            to_micros(material.created_at),
        ),
    )
    stored = yield from get_ca_material(material.kind, material.tenant_id)
    assert stored is not None
    return stored
