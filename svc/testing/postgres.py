"""
A PostgreSQL server for tests, and throwaway databases on it.

L{postgres_server} finds a server once per process:

  1. the admin URL in C{SVC_TEST_POSTGRES_URL} if set, else
     C{postgres://postgres@127.0.0.1:5432/postgres}, if it answers;
  2. otherwise a throwaway cluster: C{initdb} + C{pg_ctl} (found on C{PATH}
     or under C{/usr/lib/postgresql/*/bin}) in a temporary directory, on a
     free loopback port, trust authentication, C{fsync=off}; as root it runs
     as the C{postgres} user (C{initdb} refuses root). It is stopped and
     deleted when the process exits.

When neither works, tests are skipped with the reason; under C{CI=true} a
missing PostgreSQL is an error instead, never a silent skip.

Two ways for a test to get an empty database of its own:

  - L{database_for_test}: a new database C{svc_test_<hex>}, dropped in the
    test's cleanup (about half a second each: PostgreSQL copies a template);
  - L{schema_for_test}: a new schema C{t_<hex>} in one C{svc_test_<hex>}
    database shared by the process (dropped at exit), with a URL whose
    C{options} put that schema first on the C{search_path}; dropped in the
    test's cleanup. Much cheaper, and just as isolated for code that names
    no schema. Its URL also sets C{synchronous_commit=off}: tests do not
    test PostgreSQL's durability.

Everything here blocks (psycopg2 in its ordinary synchronous mode,
subprocesses); it is test support, called from C{setUp}.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import attrs
import psycopg2
from twisted.trial.unittest import SkipTest, TestCase

#: An admin URL of a server tests may create and drop databases on.
URL_VARIABLE = "SVC_TEST_POSTGRES_URL"
DEFAULT_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"
DATABASE_PREFIX = "svc_test_"


class PostgresUnavailable(Exception):
    """No PostgreSQL server could be reached or started (fatal under CI)."""


@attrs.frozen
class PostgresServer:
    """A server tests may use, reached through ``admin_url``."""

    admin_url: str

    def database_url(self, name: str) -> str:
        """The URL of database C{name} on this server."""
        return urlunsplit(urlsplit(self.admin_url)._replace(path="/" + name))


_found: list[PostgresServer | str] = []


def in_ci() -> bool:
    """Whether the tests run under CI (C{CI=true}), where skipping is failing."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def postgres_server() -> PostgresServer:
    """
    The process-wide test server, found or started on first use.

    @raise SkipTest: none is available (outside CI).
    @raise PostgresUnavailable: none is available under C{CI=true}.
    """
    if not _found:
        try:
            _found.append(_find_or_start())
        except PostgresUnavailable as error:
            _found.append(str(error))
    found = _found[0]
    if isinstance(found, PostgresServer):
        return found
    if in_ci():
        raise PostgresUnavailable(f"PostgreSQL is required under CI=true: {found}")
    raise SkipTest(f"no PostgreSQL for tests: {found}")


def create_database(server: PostgresServer) -> str:
    """Create a new empty database on C{server}; its URL."""
    name = DATABASE_PREFIX + secrets.token_hex(6)
    _admin(server, f'CREATE DATABASE "{name}"')
    return server.database_url(name)


def drop_database(server: PostgresServer, url: str) -> None:
    """Drop the database at C{url}, disconnecting whoever is still on it."""
    name = urlsplit(url).path.lstrip("/")
    if not name.startswith(DATABASE_PREFIX):
        raise ValueError(f"refusing to drop a database not made for tests: {name!r}")
    _admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def database_for_test(case: TestCase) -> str:
    """
    A new empty database for C{case}, dropped in its cleanup (skips or
    fails the test as L{postgres_server} says when there is no server).
    """
    server = postgres_server()
    url = create_database(server)
    case.addCleanup(drop_database, server, url)
    return url


_shared_database: list[str] = []


def schema_for_test(case: TestCase) -> str:
    """
    A URL whose connections see a new empty schema (first on their
    C{search_path}) in the process's shared test database; the schema is
    dropped in C{case}'s cleanup. Skips or fails as L{postgres_server} says.
    """
    server = postgres_server()
    if not _shared_database:
        _shared_database.append(create_database(server))
        atexit.register(drop_database, server, _shared_database[0])
    database = _shared_database[0]
    schema = "t_" + secrets.token_hex(6)
    execute(database, f'CREATE SCHEMA "{schema}"')
    case.addCleanup(execute, database, f'DROP SCHEMA "{schema}" CASCADE')
    options = f"-csearch_path%3D{schema}%20-csynchronous_commit%3Doff"
    return urlunsplit(urlsplit(database)._replace(query=f"options={options}"))


def admin_execute(server: PostgresServer, statement: str) -> None:
    """Run one statement on C{server}'s admin database, in autocommit."""
    _admin(server, statement)


def execute(url: str, statement: str) -> list[tuple[object, ...]]:
    """Run one statement on the database at C{url}, in autocommit; its rows."""
    connection = psycopg2.connect(url, connect_timeout=5)
    try:
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(statement)
            return list(cursor.fetchall()) if cursor.description is not None else []
    finally:
        connection.close()


def _admin(server: PostgresServer, statement: str) -> None:
    connection = psycopg2.connect(server.admin_url, connect_timeout=5)
    try:
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(statement)
    finally:
        connection.close()


def _answers(url: str) -> bool:
    try:
        psycopg2.connect(url, connect_timeout=3).close()
    except psycopg2.Error:
        return False
    return True


def _find_or_start() -> PostgresServer:
    url = os.environ.get(URL_VARIABLE) or DEFAULT_ADMIN_URL
    if _answers(url):
        return PostgresServer(url)
    return start_throwaway_cluster(stop_at_exit=True)[0]


def find_binary(name: str) -> str | None:
    """C{initdb} or C{pg_ctl}: on C{PATH}, else the newest Debian install."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_throwaway_cluster(stop_at_exit: bool) -> tuple[PostgresServer, Path]:
    """
    Start a new cluster in a temporary directory; the server and that
    directory. With C{stop_at_exit} it is stopped and deleted when the
    process exits; otherwise call L{stop_throwaway_cluster}.

    @raise PostgresUnavailable: no binaries, no unprivileged user, or the
        cluster did not start.
    """
    initdb, pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise PostgresUnavailable("no server answered and initdb/pg_ctl were not found")
    base = Path(tempfile.mkdtemp(prefix="svc-pg-"))
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(base, ignore_errors=True)
            raise PostgresUnavailable("running as root and there is no postgres user") from None
        os.chown(base, account.pw_uid, account.pw_gid)
    prefix = _unprivileged()
    data, port = base / "data", _free_port()
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
    commands = [
        [initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
        [
            pg_ctl,
            "-D",
            str(data),
            "-l",
            str(base / "log"),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        ],
    ]
    try:
        for command in commands:
            _run(prefix, command)
    except (OSError, subprocess.CalledProcessError) as error:
        shutil.rmtree(base, ignore_errors=True)
        raise PostgresUnavailable(f"could not start a throwaway cluster: {error}") from None
    server = PostgresServer(f"postgres://postgres@127.0.0.1:{port}/postgres")
    if stop_at_exit:
        atexit.register(stop_throwaway_cluster, base)
    return server, base


def stop_throwaway_cluster(base: Path) -> None:
    """Stop the cluster started in C{base} and delete the directory."""
    pg_ctl = find_binary("pg_ctl")
    if pg_ctl is not None:
        try:
            _run(_unprivileged(), [pg_ctl, "-D", str(base / "data"), "-m", "immediate", "stop"])
        except (OSError, subprocess.CalledProcessError):
            pass
    shutil.rmtree(base, ignore_errors=True)


def _unprivileged() -> list[str]:
    """How to run a command as the postgres user when we are root."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    return [runuser, "-u", "postgres", "--"] if runuser else ["su", "postgres", "-c"]


def _run(prefix: list[str], command: list[str]) -> None:
    if prefix[-1:] == ["-c"]:  # su postgres -c 'one shell string'
        full = [*prefix, " ".join(_quoted(part) for part in command)]
    else:
        full = [*prefix, *command]
    subprocess.run(  # noqa: S603 - fixed binaries, arguments built here
        full, check=True, capture_output=True, timeout=120, cwd="/"
    )


def _quoted(part: str) -> str:
    return "'" + part.replace("'", "'\\''") + "'"
