"""
Typed settings read once from ``SVC_*`` environment variables.

Every part reads its configuration through these helpers so that a bad value is
refused at start with a message naming the variable, never discovered later.
The full list of variables is in ``docs/configuration.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit


class ConfigError(Exception):
    """
    A configuration value is missing or malformed.

    ``variable`` names the environment variable or option at fault.
    """

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable
        self.problem = problem


def env_str(environ: Mapping[str, str], name: str, default: str | None = None) -> str:
    """
    The value of ``name``, or ``default``; a missing required value is a
    L{ConfigError}.
    """
    value = environ.get(name)
    if value is None or value == "":
        if default is None:
            raise ConfigError(name, "is required but not set")
        return default
    return value


def env_optional(environ: Mapping[str, str], name: str) -> str | None:
    """
    The value of ``name``, or L{None} when it is unset or empty.
    """
    value = environ.get(name)
    return value if value else None


def env_int(
    environ: Mapping[str, str],
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """
    An integer setting within ``[minimum, maximum]``.
    """
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise ConfigError(name, f"must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(name, f"must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(name, f"must be at most {maximum}, got {value}")
    return value


def env_path(environ: Mapping[str, str], name: str, default: str | None = None) -> Path:
    """
    A filesystem path setting (not checked for existence).
    """
    return Path(env_str(environ, name, default))


FILE_SUFFIX = "_FILE"

SECRET_VARIABLES = ("SVC_CONTROL_PLANE_TOKEN", "SVC_CA_KEK", "DATABASE_URL")
"""The secrets that may also be given as a file: C{<NAME>_FILE} (see L{with_secret_files})."""

MAX_SECRET_FILE_BYTES = 64 * 1024
"""The largest secret file read (a secret is a line; this is far above any)."""


def with_secret_files(
    environ: Mapping[str, str],
    names: Iterable[str] = SECRET_VARIABLES,
    read_file: Callable[[Path], bytes] = Path.read_bytes,
) -> Mapping[str, str]:
    """
    C{environ} with each secret C{NAME} of C{names} whose C{NAME_FILE} is
    set taken from that file: its UTF-8 text, surrounding whitespace (the
    trailing newline an editor or C{echo} adds) removed. The value is then
    checked as C{NAME} would be. The file stays where it is (mounted
    secrets, systemd credentials); the process never writes it.

    @raise ConfigError: naming C{NAME_FILE} when both C{NAME} and
        C{NAME_FILE} are set, or the file cannot be read, is larger than
        L{MAX_SECRET_FILE_BYTES}, is not UTF-8 or holds only whitespace.
    """
    resolved = dict(environ)
    for name in names:
        variable = name + FILE_SUFFIX
        path = env_optional(environ, variable)
        if path is None:
            continue
        if env_optional(environ, name) is not None:
            raise ConfigError(variable, f"set either {name} or {variable}, not both")
        resolved[name] = _secret_from_file(variable, Path(path), read_file)
    return resolved


def secret_source(environ: Mapping[str, str], name: str) -> str:
    """
    The variable the operator set for secret C{name} (C{NAME_FILE} when its
    value was read from a file by L{with_secret_files}): the one to name in
    an error about the value.
    """
    variable = name + FILE_SUFFIX
    return variable if env_optional(environ, variable) is not None else name


def _secret_from_file(variable: str, path: Path, read_file: Callable[[Path], bytes]) -> str:
    try:
        raw = read_file(path)
    except OSError as e:
        raise ConfigError(variable, f"cannot read {path}: {e.strerror or e}") from None
    if len(raw) > MAX_SECRET_FILE_BYTES:
        raise ConfigError(variable, f"{path} is larger than {MAX_SECRET_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(variable, f"{path} is not UTF-8 text") from None
    if not text:
        raise ConfigError(variable, f"{path} is empty")
    return text


def check_http_url(variable: str, raw: str) -> str:
    """
    C{raw} if it is an C{http://} or C{https://} URL with a host, a valid
    port, and no query or fragment; without its trailing C{/}.

    @raise ConfigError: naming C{variable}.
    """
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError as e:
        raise ConfigError(variable, f"not a valid URL: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(variable, f"must be an http:// or https:// URL, got {raw!r}")
    if parts.query or parts.fragment:
        raise ConfigError(variable, "must have no query or fragment")
    return raw.rstrip("/")


def process_environ() -> Mapping[str, str]:
    """
    The process environment; only ``tap.py`` modules should call this.
    """
    return os.environ
