"""
The control plane's operator commands, run against the same environment as
C{twist svc-control} (C{DATABASE_URL}, C{SVC_SECRETS_DIR},
C{SVC_SECRETS_BACKEND}, C{SVC_CA_KEK}, ...; see
C{docs/operator-commands.md}):

  - C{svc ca init [--org NAME]}: create the org root, its key encrypted
    with the KEK, in the configured backend; refuses if one exists.
  - C{svc token issue --agent ID [--ttl SECONDS]}: mint a single-use enroll
    token for the agent's allocation and print it (once) on stdout.
  - C{svc user seed --user ID [--name NAME] [--ttl SECONDS]}: create (or
    rename) a user and print a new sign-in link token on stdout.
  - C{svc user suspend|reinstate --user ID}, C{svc tenant suspend|reinstate
    --tenant ID}: suspend or reinstate a user or a tenant (nothing is
    revoked).
  - C{svc token revoke --id TOKEN_ID}: revoke one unspent enroll token.

Secrets go to stdout alone, one per line, so C{TOKEN=$(svc token issue
...)} works; everything else goes to stderr. With C{--json} (every command)
stdout has instead one JSON document, the result's facts (secret included)
under the keys C{docs/operator-commands.md} lists, printed as the fleet
commands print theirs (L{svc.control.fleet_cli.print_json}); stderr is
unchanged. Exit status 0 on success, 1 when refused or misconfigured, 2 on
bad usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.task import react

from svc.config import ConfigError
from svc.control.ca import certificate_fingerprint, init_org_root
from svc.control.enrollment import format_timestamp, hash_token, new_secret_token
from svc.control.fleet_cli import json_flag, print_json
from svc.control.owner_auth import hash_link_secret
from svc.control.routes_access import revoked_token_body, tenant_body
from svc.control.routes_entities import EntityRoutes, minted_token_body
from svc.control.settings import ControlSettings, SecretsBackend
from svc.control.store.errors import ControlStoreError, NotFound
from svc.control.store.interface import ControlStore
from svc.control.store.opening import open_store
from svc.pki import names
from svc.pki.errors import CAAlreadyInitialised, InvalidName, PKIError
from svc.sessions import session_key
from svc.worker import IWorker, ThreadWorker

_HEX = "0123456789abcdef"

DEFAULT_SESSION_TTL_SECONDS = 12 * 3600
"""Lifetime of an admin session made by C{svc user seed}."""
MINIMUM_TTL_SECONDS = 60
MAXIMUM_TTL_SECONDS = 7 * 24 * 3600


class CommandRefused(Exception):
    """The command cannot do what was asked; the message says why."""


@attrs.frozen
class OperatorContext:
    """
    The world a command runs in (injected so tests run in-process).

    @ivar reactor: gives the time (C{seconds()}) and runs PostgreSQL.
    @ivar worker: blocking CA file I/O and key encryption.
    @ivar store_worker: the SQLite store's worker (L{None}: its own thread).
    """

    environ: Mapping[str, str] = attrs.field(repr=False)
    reactor: Any
    worker: IWorker
    stdout: TextIO
    stderr: TextIO
    store_worker: IWorker | None = None

    def now(self) -> datetime:
        """The reactor's time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.reactor.seconds(), UTC)


Command = Callable[[argparse.Namespace, OperatorContext], Awaitable[None]]


def _ttl(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not MINIMUM_TTL_SECONDS <= value <= MAXIMUM_TTL_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be {MINIMUM_TTL_SECONDS}-{MAXIMUM_TTL_SECONDS} seconds"
        )
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add these commands to C{svc}."""
    ca = subparsers.add_parser("ca", help="the agent certificate authority")
    ca_commands = ca.add_subparsers(dest="ca_command", required=True)
    init = ca_commands.add_parser("init", help="create the org root CA")
    init.add_argument("--org", metavar="NAME", help="organisation name (default $SVC_ORG_NAME)")
    json_flag(init)
    init.set_defaults(run=_run, operator_command=ca_init)

    token = subparsers.add_parser("token", help="enroll tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    issue = token_commands.add_parser("issue", help="mint a single-use enroll token")
    issue.add_argument("--agent", required=True, metavar="ID", help="the agent to enroll")
    issue.add_argument(
        "--ttl",
        type=_ttl,
        metavar="SECONDS",
        help="lifetime (default $SVC_ENROLL_TOKEN_TTL_SECONDS)",
    )
    json_flag(issue)
    issue.set_defaults(run=_run, operator_command=token_issue)

    user = subparsers.add_parser("user", help="dashboard users")
    user_commands = user.add_subparsers(dest="user_command", required=True)
    seed = user_commands.add_parser("seed", help="create a user and an admin session")
    seed.add_argument("--user", required=True, metavar="ID", help="user (owner) id")
    seed.add_argument("--name", metavar="NAME", help="display name (default: the id)")
    seed.add_argument(
        "--ttl",
        type=_ttl,
        default=DEFAULT_SESSION_TTL_SECONDS,
        metavar="SECONDS",
        help=f"session lifetime (default {DEFAULT_SESSION_TTL_SECONDS})",
    )
    json_flag(seed)
    seed.set_defaults(run=_run, operator_command=user_seed)
    _register_access(subparsers, token_commands, user_commands)


def _register_access(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    token_commands: argparse._SubParsersAction[argparse.ArgumentParser],
    user_commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """
    Add C{svc user suspend|reinstate}, C{svc tenant suspend|reinstate} and
    C{svc token revoke}.
    """
    for verb, command, text in (
        ("suspend", user_suspend, "suspend a user: no sign-in, enrollment or renewal"),
        ("reinstate", user_reinstate, "lift a user's suspension"),
    ):
        parser = user_commands.add_parser(verb, help=text)
        parser.add_argument("--user", required=True, metavar="ID", help="user (owner) id")
        json_flag(parser)
        parser.set_defaults(run=_run, operator_command=command)
    tenant = subparsers.add_parser("tenant", help="tenants")
    tenant_commands = tenant.add_subparsers(dest="tenant_command", required=True)
    for verb, command, text in (
        ("suspend", tenant_suspend, "suspend a tenant: no enrollment or renewal"),
        ("reinstate", tenant_reinstate, "lift a tenant's suspension"),
    ):
        parser = tenant_commands.add_parser(verb, help=text)
        parser.add_argument("--tenant", required=True, metavar="ID", help="tenant id")
        json_flag(parser)
        parser.set_defaults(run=_run, operator_command=command)
    revoke = token_commands.add_parser("revoke", help="revoke one unspent enroll token")
    revoke.add_argument(
        "--id", required=True, metavar="TOKEN_ID", help="the token's id (printed when minted)"
    )
    json_flag(revoke)
    revoke.set_defaults(run=_run, operator_command=token_revoke)


def build_parser() -> argparse.ArgumentParser:
    """A parser with only these commands (the C{svc} command adds the rest)."""
    parser = argparse.ArgumentParser(prog="svc", description="svc operator commands")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run one of these commands as a process would (on the global reactor);
    exits the process with the command's status.
    """
    args = build_parser().parse_args(argv)
    status: int = args.run(args)
    return status


def run_command(args: argparse.Namespace, context: OperatorContext) -> Deferred[int]:
    """Run the parsed command; fires with its exit status."""
    return Deferred.fromCoroutine(_run_command(args, context))


def operator_main(argv: Sequence[str], context: OperatorContext) -> Deferred[int]:
    """Parse C{argv} (no program name) and run the command in C{context}."""
    return run_command(build_parser().parse_args(argv), context)


async def _run_command(args: argparse.Namespace, context: OperatorContext) -> int:
    command: Command = args.operator_command
    try:
        await command(args, context)
    except (ConfigError, CommandRefused, ControlStoreError, PKIError) as e:
        context.stderr.write(f"svc: {_name(args)}: {_describe(e)}\n")
        return 1
    return 0


def _name(args: argparse.Namespace) -> str:
    sub = getattr(args, "ca_command", None) or getattr(args, "token_command", None)
    sub = sub or getattr(args, "user_command", None) or getattr(args, "tenant_command", None)
    return f"{args.command} {sub}"


def _describe(error: Exception) -> str:
    if isinstance(error, CAAlreadyInitialised):
        return f"refused: {error}"
    if isinstance(error, NotFound):
        return f"not found: {error.message}"
    return str(error)


def _run(args: argparse.Namespace) -> int:
    """The C{svc} entry point: run on the global reactor, exit with the status."""

    def main(reactor: Any) -> Deferred[None]:
        worker = ThreadWorker(reactor, "svc-operator", threads=1)
        context = OperatorContext(os.environ, reactor, worker, sys.stdout, sys.stderr)

        def finish(status: int) -> None:
            worker.stop()
            if status:
                raise SystemExit(status)

        return run_command(args, context).addCallback(finish)

    react(main)
    return 0  # not reached: react exits


async def _with_store(
    settings: ControlSettings,
    context: OperatorContext,
    use: Callable[[ControlStore], Awaitable[None]],
) -> None:
    if settings.database_url is None:
        raise ConfigError("DATABASE_URL", "is required for this command")
    if settings.control_plane_token is None:
        raise ConfigError("SVC_CONTROL_PLANE_TOKEN", "is required with DATABASE_URL")
    try:
        store = await open_store(
            settings.database_url,
            context.reactor,
            worker=context.store_worker,
            session_key=session_key(settings.control_plane_token),
        )
    except (ConfigError, ControlStoreError):
        raise
    except Exception as e:  # the database's own connection errors, whatever the engine
        raise CommandRefused(f"cannot open the database: {type(e).__name__}: {e}") from None
    try:
        await use(store)
    finally:
        await store.close()


def _settings(context: OperatorContext) -> ControlSettings:
    return ControlSettings.from_environ(context.environ)


async def ca_init(args: argparse.Namespace, context: OperatorContext) -> None:
    """C{svc ca init}."""
    settings = _settings(context)
    if args.org is not None:
        try:
            settings = attrs.evolve(settings, org_name=names.check_org(args.org))
        except InvalidName as e:
            raise CommandRefused(f"--org: {e}") from None
    now = context.now()

    async def create(store: ControlStore | None) -> None:
        root = await init_org_root(settings, store, now, context.worker)
        in_database = settings.secrets_backend is SecretsBackend.POSTGRES
        facts = {
            "subject": root.cert.subject.rfc4514_string(),
            "serial": names.format_serial(root.cert.serial_number),
            "not_after": format_timestamp(root.cert.not_valid_after_utc),
            "sha256": certificate_fingerprint(root.cert),
        }
        if args.json:
            print_json(
                context.stdout,
                {
                    "backend": settings.secrets_backend.value,
                    "secrets_dir": None if in_database else str(settings.secrets_dir),
                    "key_encrypted": settings.ca_kek is not None,
                    **facts,
                },
            )
        else:
            where = "the database" if in_database else str(settings.secrets_dir)
            context.stdout.write(f"org root created in {where}\n")
            context.stdout.writelines(f"{key}: {value}\n" for key, value in facts.items())
        if settings.ca_kek is None:
            context.stderr.write("warning: no SVC_CA_KEK: the root key is NOT encrypted\n")

    if settings.database_url is None:
        await create(None)
    else:
        await _with_store(settings, context, create)


async def token_issue(args: argparse.Namespace, context: OperatorContext) -> None:
    """C{svc token issue}."""
    settings = _settings(context)
    ttl = timedelta(seconds=args.ttl or settings.enroll_token_ttl_seconds)
    now = context.now()

    async def issue(store: ControlStore) -> None:
        allocation = await store.get_agent_allocation(args.agent)
        if not allocation.live:
            raise CommandRefused(f"agent {args.agent}'s allocation is {allocation.state.value}")
        token = new_secret_token()
        minted = await store.create_enroll_token(
            allocation.allocation_id, hash_token(token), now, now + ttl
        )
        if args.json:
            body = minted_token_body(token, minted, allocation)
            print_json(context.stdout, {**body, "tenant": allocation.tenant_id})
        else:
            context.stdout.write(token + "\n")
        context.stderr.write(
            f"enroll token {minted.token_id} for agent {args.agent}"
            f" (tenant {allocation.tenant_id}, allocation {allocation.allocation_id})"
            f" expires at {format_timestamp(minted.expires_at)}; single use, shown once\n"
        )

    await _with_store(settings, context, issue)


async def user_seed(args: argparse.Namespace, context: OperatorContext) -> None:
    """C{svc user seed}."""
    settings = _settings(context)
    now = context.now()

    async def seed(store: ControlStore) -> None:
        user = await store.put_user(args.user, args.name or args.user, now)
        token = new_secret_token()
        session = await store.create_admin_session(
            user.user_id, hash_link_secret(token), now, now + timedelta(seconds=args.ttl)
        )
        if args.json:
            print_json(
                context.stdout,
                {
                    "token": token,
                    "user_id": user.user_id,
                    "display_name": user.display_name,
                    "expires_at": format_timestamp(session.expires_at),
                },
            )
        else:
            context.stdout.write(token + "\n")
        context.stderr.write(
            f"admin session for user {user.user_id} ({user.display_name}) expires at"
            f" {format_timestamp(session.expires_at)}; open"
            " <control-plane>/admin/session?token=<the token above> to sign in\n"
        )

    await _with_store(settings, context, seed)


def _checked_id(value: str, option: str) -> str:
    try:
        return names.check_id(value, option)
    except InvalidName as e:
        raise CommandRefused(f"--{option}: {e}") from None


async def _set_user_suspended(
    args: argparse.Namespace, context: OperatorContext, suspended: bool
) -> None:
    user_id = _checked_id(args.user, "user")

    async def change(store: ControlStore) -> None:
        user = await store.set_user_suspended(user_id, suspended)
        if args.json:
            allocations = await store.list_allocations(user.user_id)
            print_json(context.stdout, EntityRoutes.account_entity(user, allocations))
            return
        state = "suspended" if user.suspended else "reinstated (not suspended)"
        context.stdout.write(f"user {user.user_id} {state}\n")

    await _with_store(_settings(context), context, change)


async def user_suspend(args: argparse.Namespace, context: OperatorContext) -> None:
    """C{svc user suspend}."""
    await _set_user_suspended(args, context, True)


async def user_reinstate(args: argparse.Namespace, context: OperatorContext) -> None:
    """C{svc user reinstate}."""
    await _set_user_suspended(args, context, False)


async def _set_tenant_suspended(
    args: argparse.Namespace, context: OperatorContext, suspended: bool
) -> None:
    tenant_id = _checked_id(args.tenant, "tenant")

    async def change(store: ControlStore) -> None:
        tenant = await store.set_tenant_suspended(tenant_id, suspended)
        if args.json:
            print_json(context.stdout, tenant_body(tenant))
            return
        state = "suspended" if tenant.suspended else "reinstated (not suspended)"
        context.stdout.write(f"tenant {tenant.tenant_id} (owner {tenant.owner_id}) {state}\n")

    await _with_store(_settings(context), context, change)


async def tenant_suspend(args: argparse.Namespace, context: OperatorContext) -> None:
    """C{svc tenant suspend}."""
    await _set_tenant_suspended(args, context, True)


async def tenant_reinstate(args: argparse.Namespace, context: OperatorContext) -> None:
    """C{svc tenant reinstate}."""
    await _set_tenant_suspended(args, context, False)


async def token_revoke(args: argparse.Namespace, context: OperatorContext) -> None:
    """C{svc token revoke}: refused (status 1) when the token was already spent."""
    token_id = args.id
    if not isinstance(token_id, str) or len(token_id) != 32 or token_id.strip(_HEX):
        raise CommandRefused(f"--id: not an enroll token id (32 lowercase hex): {token_id!r}")
    now = context.now()

    async def revoke(store: ControlStore) -> None:
        token = await store.revoke_enroll_token(token_id, now)
        if token.consumed_at is not None:
            raise CommandRefused(
                f"enroll token {token_id} was spent at {format_timestamp(token.consumed_at)};"
                " nothing revoked (revoke the agent to end its enrollment)"
            )
        assert token.revoked_at is not None
        if args.json:
            allocation = await store.get_allocation(token.allocation_id)
            print_json(context.stdout, revoked_token_body(token, allocation.agent_id))
            return
        context.stdout.write(
            f"enroll token {token_id} revoked at {format_timestamp(token.revoked_at)}\n"
        )

    await _with_store(_settings(context), context, revoke)
