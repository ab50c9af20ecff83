"""
The identifiers that go into certificates, and their accepted forms.

Tenant, agent and user ids become path components and URI path segments, so
they are held to a conservative alphabet in which no slash, no ``..`` and no
percent-escape can occur. Everything here is pure.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from svc.pki.errors import InvalidName

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""Tenant, agent and user ids: 1 to 64 characters from C{[A-Za-z0-9._-]},
starting with a letter or digit, never containing C{..}. 64 is the X.520 upper
bound of a CN, which a user id becomes."""

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_DNS_PATTERN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_ORG_PATTERN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9 .,&'()_-]*[A-Za-z0-9.)])?")

MAX_CN_LENGTH = 64
"""X.520 ub-common-name; C{cryptography} refuses longer CNs."""

ROOT_CN_SUFFIX = " Root CA"
CONTROL_CN = "svc-control"
TENANT_OU_PREFIX = "tenant="


def check_id(value: str, what: str = "id") -> str:
    """
    Return C{value} if it is an acceptable tenant, agent or user id, else
    raise L{InvalidName} naming C{what}.
    """
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value) or ".." in value:
        raise InvalidName(f"{what} must match {ID_PATTERN.pattern} without '..': {value!r}")
    return value


def check_trust_domain(value: str) -> str:
    """
    Return C{value} if it is a lowercase DNS-like SPIFFE trust domain (at most
    253 characters), else raise L{InvalidName}.
    """
    if not isinstance(value, str) or len(value) > 253 or not _DNS_PATTERN.fullmatch(value):
        raise InvalidName(f"trust domain must be a lowercase DNS-like name: {value!r}")
    return value


def check_fqdn(value: str) -> str:
    """
    Return C{value} lower-cased if it is a DNS host name that fits a CN (at
    most 64 characters), else raise L{InvalidName}.
    """
    if not isinstance(value, str):
        raise InvalidName(f"host name must be a string: {value!r}")
    lowered = value.lower()
    if len(lowered) > MAX_CN_LENGTH or not _DNS_PATTERN.fullmatch(lowered):
        raise InvalidName(f"host name must be a DNS name of at most 64 characters: {value!r}")
    return lowered


def check_org(value: str) -> str:
    """
    Return C{value} if it is an acceptable organisation name: printable ASCII
    letters, digits, spaces and C{.,&'()_-}, starting with a letter or digit,
    short enough that C{"<ORG> Root CA"} fits a CN. Else raise L{InvalidName}.
    """
    limit = MAX_CN_LENGTH - len(ROOT_CN_SUFFIX)
    if not isinstance(value, str) or len(value) > limit or not _ORG_PATTERN.fullmatch(value):
        raise InvalidName(f"organisation name must be {limit} plain characters at most: {value!r}")
    return value


def root_common_name(org: str) -> str:
    """
    The org root's CN, C{"<ORG> Root CA"}.
    """
    return check_org(org) + ROOT_CN_SUFFIX


def org_from_root_common_name(common_name: str) -> str:
    """
    The organisation name inside a root CN made by L{root_common_name}.
    """
    if not common_name.endswith(ROOT_CN_SUFFIX):
        raise InvalidName(f"not an org root CN: {common_name!r}")
    return check_org(common_name[: -len(ROOT_CN_SUFFIX)])


def intermediate_common_name(org: str, tenant_id: str) -> str:
    """
    The tenant intermediate's CN, C{"<ORG> Tenant <tenant_id> Intermediate"};
    L{InvalidName} if it would be longer than 64 characters.
    """
    name = f"{check_org(org)} Tenant {check_id(tenant_id, 'tenant id')} Intermediate"
    if len(name) > MAX_CN_LENGTH:
        raise InvalidName(
            f"intermediate CN {name!r} is longer than {MAX_CN_LENGTH} characters; "
            "use a shorter organisation name or tenant id"
        )
    return name


def tenant_ou(tenant_id: str) -> str:
    """
    The OU value binding a certificate to a tenant, C{"tenant=<tenant_id>"}.
    """
    return TENANT_OU_PREFIX + check_id(tenant_id, "tenant id")


def tenant_from_ou(value: str) -> str | None:
    """
    The tenant id inside an OU C{"tenant=<id>"}, or L{None} if C{value} is not
    of that form.
    """
    if not value.startswith(TENANT_OU_PREFIX):
        return None
    try:
        return check_id(value[len(TENANT_OU_PREFIX) :])
    except InvalidName:
        return None


def tenant_spiffe_id(trust_domain: str, tenant_id: str) -> str:
    """
    C{spiffe://<trust_domain>/tenant/<tenant_id>}.
    """
    return f"spiffe://{check_trust_domain(trust_domain)}/tenant/{check_id(tenant_id, 'tenant id')}"


def agent_spiffe_id(trust_domain: str, agent_id: str) -> str:
    """
    C{spiffe://<trust_domain>/agent/<agent_id>}.
    """
    return f"spiffe://{check_trust_domain(trust_domain)}/agent/{check_id(agent_id, 'agent id')}"


def control_spiffe_id(trust_domain: str) -> str:
    """
    C{spiffe://<trust_domain>/control}, the control plane's identity.
    """
    return f"spiffe://{check_trust_domain(trust_domain)}/control"


def split_spiffe_id(uri: str) -> tuple[str, str] | None:
    """
    Split C{spiffe://<domain>/<path>} into C{(domain, path)} (the path without
    its leading slash), or L{None} if C{uri} is not a SPIFFE id with a
    non-empty domain. The parts are not validated further.
    """
    prefix = "spiffe://"
    if not uri.startswith(prefix):
        return None
    rest = uri[len(prefix) :]
    domain, slash, path = rest.partition("/")
    if not domain or not slash:
        return None
    return domain, path


def format_serial(serial: int) -> str:
    """
    The canonical text form of a certificate serial number: lowercase
    hexadecimal, no C{0x} prefix, no leading zeros (C{"0"} for zero). Audit
    lines, the deny-list and the revocation table all use this form.
    """
    if serial < 0:
        raise InvalidName(f"serial numbers are not negative: {serial}")
    return format(serial, "x")


_SERIAL_PATTERN = re.compile(r"0|[1-9a-f][0-9a-f]{0,40}")


def check_serial(value: str) -> str:
    """
    Return C{value} if it is in the canonical form of L{format_serial} (at
    most 41 hex digits, enough for a 160-bit serial), else L{InvalidName}.
    """
    if not isinstance(value, str) or not _SERIAL_PATTERN.fullmatch(value):
        raise InvalidName(f"serial must be lowercase hex without leading zeros: {value!r}")
    return value


def check_utc(moment: datetime, what: str = "time") -> datetime:
    """
    Return C{moment} converted to UTC; a naive datetime is refused with
    L{InvalidName} rather than guessed at.
    """
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidName(f"{what} must be timezone-aware: {moment!r}")
    return moment.astimezone(UTC)
