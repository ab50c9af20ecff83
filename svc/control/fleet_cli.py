"""
The operator's fleet commands, clients of a running control plane with the
service token (C{docs/operator-commands.md}, "Fleet commands"):

  - C{svc allocations list [--state S] [--owner ID] [--json]}
  - C{svc agents list [--state S] [--owner ID] [--json]}
  - C{svc usage show OWNER [--json]}
  - C{svc gc sweep [--server FQDN]... [--json]}
  - C{svc purge sweep [--json]}

They read C{SVC_CONTROL_URL}, C{SVC_CONTROL_PLANE_TOKEN} (or
C{SVC_CONTROL_PLANE_TOKEN_FILE}) and C{SVC_CA_FILE} (the CA of an HTTPS
control plane), and call the operator routes (L{svc.control.routes_fleet})
and C{GET /v1/tenants/{owner}/usage} through the host SDK's transport. The
control plane does the data-plane calls with its own certificate: these
commands hold only the service token.

Output: a table on stdout, or with C{--json} one JSON document (the format
in the doc above). The two sweeps go one item at a time (one server, one
allocation) and print a progress line on stderr after each, so a long sweep
shows where it is and an interrupted one has done whole items only. Exit
status 0 done, 1 refused, misconfigured or some item failed (named on
stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TextIO

import attrs

from svc.config import ConfigError, env_optional, with_secret_files
from svc.sdk.errors import SvcError
from svc.sdk.transport import Answer, Endpoint, Transport, encode_segment
from svc.version import version_line

PAGE = 500
"""Allocations asked for per page."""

TIMEOUT = 60.0
"""Seconds each call may take."""

GC_TIMEOUT = 960.0
"""Seconds one server's collection may take (the control plane allows it 900)."""

STATES = ("provisioned", "revoked", "purged")


class Caller(Protocol):
    """Sends one request (L{svc.sdk.transport.Transport}'s C{request})."""

    def request(
        self, operation: str, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> Answer:
        """The 2xx answer, else an L{SvcError}."""


class FleetRefused(Exception):
    """The command cannot run; the message names why."""


@attrs.frozen
class FleetContext:
    """
    The world a command runs in (injected so tests run it against an app).

    @ivar caller: makes the caller for a timeout in seconds.
    """

    caller: Callable[[float], Caller]
    stdout: TextIO
    stderr: TextIO


def transport_from(environ: Mapping[str, str]) -> Callable[[float], Caller]:
    """
    The SDK transport to C{SVC_CONTROL_URL} with the service token.

    @raise ConfigError: a variable is missing or malformed.
    """
    environ = with_secret_files(environ, ("SVC_CONTROL_PLANE_TOKEN",))
    url = env_optional(environ, "SVC_CONTROL_URL")
    if url is None:
        raise ConfigError("SVC_CONTROL_URL", "is required: the control plane to ask")
    try:
        endpoint = Endpoint.from_url(url)
    except ValueError as e:
        raise ConfigError("SVC_CONTROL_URL", str(e)) from None
    token = env_optional(environ, "SVC_CONTROL_PLANE_TOKEN")
    if token is None:
        raise ConfigError(
            "SVC_CONTROL_PLANE_TOKEN", "is required (or SVC_CONTROL_PLANE_TOKEN_FILE)"
        )
    ca_file = env_optional(environ, "SVC_CA_FILE")
    context = None
    if endpoint.scheme == "https":
        try:
            context = ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError("SVC_CA_FILE", f"cannot use {ca_file}: {e}") from None
    agent = version_line("svc").split(" (", 1)[0].replace(" ", "/")

    def make(timeout: float) -> Caller:
        return Transport(endpoint, token, timeout=timeout, ssl_context=context, user_agent=agent)

    return make


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the fleet commands to C{svc}."""
    for noun, help_text, command in (
        ("allocations", "every owner's disk allocations", list_allocations),
        ("agents", "every agent (agent-scoped allocation)", list_agents),
    ):
        parser = subparsers.add_parser(noun, help=help_text)
        verbs = parser.add_subparsers(dest=f"{noun}_command", required=True)
        listing = verbs.add_parser("list", help=f"list {help_text}")
        listing.add_argument("--state", choices=STATES, help="only this state")
        listing.add_argument("--owner", metavar="ID", help="only this owner's")
        json_flag(listing)
        listing.set_defaults(run=_run, fleet_command=command)

    usage = subparsers.add_parser("usage", help="an owner's storage use")
    usage_verbs = usage.add_subparsers(dest="usage_command", required=True)
    show = usage_verbs.add_parser("show", help="the owner's use on every data-plane server")
    show.add_argument("owner", metavar="OWNER")
    json_flag(show)
    show.set_defaults(run=_run, fleet_command=show_usage)

    gc = subparsers.add_parser("gc", help="garbage collection on the data-plane servers")
    gc_verbs = gc.add_subparsers(dest="gc_command", required=True)
    sweep = gc_verbs.add_parser("sweep", help="collect now, one server after the other")
    sweep.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="FQDN",
        help="only this server (repeatable; default: every registered one)",
    )
    json_flag(sweep)
    sweep.set_defaults(run=_run, fleet_command=gc_sweep)

    purge = subparsers.add_parser("purge", help="erase revoked allocations' data")
    purge_verbs = purge.add_subparsers(dest="purge_command", required=True)
    purge_sweep_parser = purge_verbs.add_parser(
        "sweep", help="purge every revoked allocation, one after the other"
    )
    json_flag(purge_sweep_parser)
    purge_sweep_parser.set_defaults(run=_run, fleet_command=purge_sweep)


def json_flag(parser: argparse.ArgumentParser) -> None:
    """Give C{parser} the C{--json} option (L{print_json} then prints the result)."""
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run_fleet_command(args: argparse.Namespace, context: FleetContext) -> int:
    """Run the parsed command; its exit status."""
    command: Callable[[argparse.Namespace, FleetContext], int] = args.fleet_command
    try:
        return command(args, context)
    except (ConfigError, FleetRefused) as e:
        context.stderr.write(f"svc: {_name(args)}: {e}\n")
    except SvcError as e:
        context.stderr.write(f"svc: {_name(args)}: {_describe(e)}\n")
    return 1


def _run(args: argparse.Namespace) -> int:
    """The C{svc} entry point, on the process's environment and streams."""
    try:
        caller = transport_from(os.environ)
    except ConfigError as e:
        sys.stderr.write(f"svc: {_name(args)}: {e}\n")
        return 1
    return run_fleet_command(args, FleetContext(caller, sys.stdout, sys.stderr))


def _name(args: argparse.Namespace) -> str:
    verb = next(
        (value for key, value in vars(args).items() if key.endswith("_command") and value),
        "",
    )
    return f"{args.command} {verb}".strip()


def _describe(error: SvcError) -> str:
    if error.status is None:
        return f"cannot reach the control plane: {error.message}"
    detail = error.code or "error"
    if error.message:
        detail += f" ({error.message})"
    return f"{error.method} {error.path}: HTTP {error.status} {detail}"


# Reading


def _allocations(
    caller: Caller, state: str | None, progress: TextIO | None
) -> Iterator[dict[str, Any]]:
    """Every allocation (in C{state}), page after page."""
    after: str | None = None
    fetched = 0
    while True:
        query = f"?limit={PAGE}"
        if state is not None:
            query += f"&state={state}"
        if after is not None:
            query += f"&after={encode_segment(after)}"
        body = caller.request("list_allocations", "GET", "/v1/admin/allocations" + query)
        page = body.json_object()
        entries = page.get("allocations")
        if not isinstance(entries, list):
            raise body.invalid("allocations is not a list")
        yield from entries
        fetched += len(entries)
        after = page.get("next")
        if not isinstance(after, str):
            return
        if progress is not None:
            progress.write(f"... {fetched} allocations so far\n")


def _selected(args: argparse.Namespace, context: FleetContext) -> list[dict[str, Any]]:
    found = _allocations(context.caller(TIMEOUT), args.state, context.stderr)
    return [a for a in found if args.owner is None or a.get("owner") == args.owner]


# Commands


def list_allocations(args: argparse.Namespace, context: FleetContext) -> int:
    """C{svc allocations list}."""
    allocations = _selected(args, context)
    if args.json:
        print_json(context.stdout, {"allocations": allocations})
        return 0
    rows = [
        [
            a["allocation_id"],
            a.get("agent_id") or "-",
            a["owner"],
            a["tenant"],
            a["state"],
            human_bytes(a["grant_bytes"]),
            a["created_at"],
        ]
        for a in allocations
    ]
    header = ["ALLOCATION", "AGENT", "OWNER", "TENANT", "STATE", "GRANT", "CREATED"]
    _print_table(context.stdout, header, rows)
    return 0


def list_agents(args: argparse.Namespace, context: FleetContext) -> int:
    """C{svc agents list}: the agent-scoped allocations."""
    agents = [a for a in _selected(args, context) if a.get("agent_id")]
    if args.json:
        print_json(context.stdout, {"agents": agents})
        return 0
    rows = [
        [a["agent_id"], a["owner"], a["tenant"], a["state"], human_bytes(a["grant_bytes"])]
        for a in agents
    ]
    _print_table(context.stdout, ["AGENT", "OWNER", "TENANT", "STATE", "GRANT"], rows)
    return 0


def show_usage(args: argparse.Namespace, context: FleetContext) -> int:
    """C{svc usage show OWNER}."""
    path = f"/v1/tenants/{encode_segment(args.owner)}/usage"
    usage = context.caller(TIMEOUT).request("usage", "GET", path).json_object()
    if args.json:
        print_json(context.stdout, usage)
        return 0
    budget = usage.get("budget_bytes")
    out = context.stdout
    out.write(
        f"owner {usage.get('owner')}: {human_bytes(usage.get('used_bytes', 0))} used"
        f" of {'no budget' if budget is None else human_bytes(budget)}\n"
    )
    agents = usage.get("agents")
    rows = [
        [
            agent,
            human_bytes(entry.get("used_bytes", 0)),
            "-" if entry.get("grant_bytes") is None else human_bytes(entry["grant_bytes"]),
            entry.get("state") or "-",
        ]
        for agent, entry in sorted(agents.items() if isinstance(agents, dict) else [])
    ]
    if rows:
        _print_table(out, ["AGENT", "USED", "GRANT", "STATE"], rows)
    return 0


def gc_sweep(args: argparse.Namespace, context: FleetContext) -> int:
    """C{svc gc sweep}: one server after the other, a progress line after each."""
    servers: Sequence[str] = args.server
    if not servers:
        answer = context.caller(TIMEOUT).request("list_servers", "GET", "/v1/admin/servers")
        listed = answer.json_object().get("servers")
        if not isinstance(listed, list):
            raise answer.invalid("servers is not a list")
        servers = [str(s["fqdn"]) for s in listed]
    if not servers:
        raise FleetRefused("no data-plane server is registered")
    caller = context.caller(GC_TIMEOUT)
    results: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for n, fqdn in enumerate(servers, 1):
        path = f"/v1/admin/servers/{encode_segment(fqdn)}/gc"
        try:
            result = caller.request("gc", "POST", path, {}).json_object()
        except SvcError as e:
            failed.append({"fqdn": fqdn, "error": _describe(e)})
            context.stderr.write(f"gc {n}/{len(servers)} {fqdn}: failed: {_describe(e)}\n")
            continue
        results.append(result)
        context.stderr.write(
            f"gc {n}/{len(servers)} {fqdn}: {result.get('count', 0)} chunks,"
            f" {human_bytes(result.get('bytes_freed', 0))} freed over"
            f" {result.get('tenants', 0)} tenants{' (dry run)' if result.get('dry_run') else ''}\n"
        )
    summary = {
        "servers": results,
        "failed": failed,
        "count": sum(int(r.get("count", 0)) for r in results),
        "bytes_freed": sum(int(r.get("bytes_freed", 0)) for r in results),
    }
    if args.json:
        print_json(context.stdout, summary)
    else:
        context.stdout.write(
            f"collected {summary['count']} chunks, {human_bytes(summary['bytes_freed'])}"
            f" on {len(results)} of {len(servers)} servers\n"
        )
    return 1 if failed else 0


def purge_sweep(args: argparse.Namespace, context: FleetContext) -> int:
    """C{svc purge sweep}: one revoked allocation after the other, a progress line after each."""
    work = list(_allocations(context.caller(TIMEOUT), "revoked", context.stderr))
    caller = context.caller(TIMEOUT)
    purged: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for n, allocation in enumerate(work, 1):
        allocation_id = str(allocation["allocation_id"])
        who = f"allocation {allocation_id} (agent {allocation.get('agent_id') or '-'})"
        path = f"/v1/admin/allocations/{encode_segment(allocation_id)}/purge"
        try:
            result = caller.request("purge", "POST", path, {}).json_object()
        except SvcError as e:
            failed.append(
                {
                    "allocation_id": allocation_id,
                    "agent_id": allocation.get("agent_id"),
                    "error": _describe(e),
                }
            )
            context.stderr.write(f"purge {n}/{len(work)} {who}: failed: {_describe(e)}\n")
            continue
        purged.append(result)
        context.stderr.write(
            f"purge {n}/{len(work)} {who}: {result.get('count', 0)} manifests,"
            f" {human_bytes(result.get('bytes_freed', 0))} freed\n"
        )
    if args.json:
        print_json(context.stdout, {"purged": purged, "failed": failed})
    else:
        freed = sum(int(r.get("bytes_freed", 0)) for r in purged)
        context.stdout.write(
            f"purged {len(purged)} of {len(work)} revoked allocations, {human_bytes(freed)} freed\n"
        )
    return 1 if failed else 0


# Output


def human_bytes(value: object) -> str:
    """C{value} bytes with a binary unit (C{1.5 GiB}); exact below 1 KiB."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "?"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{value} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("not reached")


def print_json(out: TextIO, document: object) -> None:
    """A command's result as one JSON document (indented, keys sorted) on C{out}."""
    out.write(json.dumps(document, indent=2, sort_keys=True) + "\n")


def _print_table(out: TextIO, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    lines = [list(header), *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
        out.write("\n")
