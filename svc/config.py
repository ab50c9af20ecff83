"""
Typed settings read once from ``SVC_*`` environment variables.

Every part reads its configuration through these helpers so that a bad value is
refused at start with a message naming the variable, never discovered later.
The full list of variables is in ``docs/configuration.md``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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
