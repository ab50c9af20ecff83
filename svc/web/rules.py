"""
The control plane's general HTTP rules as pure functions: request ids,
bearer credentials, JSON request bodies.

Nothing here touches a request object; L{svc.control.http} applies these to
real requests. Each rule is documented in
C{docs/specifications/control-http.md}.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Sequence

from svc.web.errors import InvalidRequest, JsonValue

API_MAJOR_VERSION = 1
"""The control-plane API major, sent as C{Svc-API-Version} on every response."""

REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""An incoming C{X-Request-ID} is kept only when it matches this in full."""

TOKEN68_PATTERN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
"""RFC 7235 C{token68}: the only credential shape a Bearer header carries."""

JSON_MEDIA_TYPE = "application/json"

# Body descriptions (400 invalid_request).
BODY_TOO_LARGE = "body_too_large"
CONTENT_TYPE_NOT_JSON = "content_type_not_json"
BODY_NOT_JSON = "body_not_json"
BODY_NOT_OBJECT = "body_not_object"
BODY_REQUIRED = "body_required"


def new_request_id() -> str:
    """
    A fresh request id: 32 lowercase hex digits (128 random bits).
    """
    return secrets.token_hex(16)


def is_well_formed_request_id(value: str) -> bool:
    """
    Whether C{value} is an acceptable request id: 1 to 128 characters of
    C{[A-Za-z0-9._-]}.
    """
    return REQUEST_ID_PATTERN.fullmatch(value) is not None


def choose_request_id(incoming: Sequence[bytes] | None, fresh: str) -> str:
    """
    The id for a request: the incoming C{X-Request-ID} when exactly one
    well-formed value was sent, else C{fresh}.
    """
    if incoming is None or len(incoming) != 1:
        return fresh
    try:
        value = incoming[0].decode("ascii")
    except UnicodeDecodeError:
        return fresh
    return value if is_well_formed_request_id(value) else fresh


def parse_bearer(header: str | bytes | None) -> str | None:
    """
    The credential in one C{Authorization} header value, or L{None}.

    The scheme keyword C{Bearer} matches case-insensitively; spaces and tabs
    around and between the parts are tolerated; the credential must be a
    single RFC 7235 C{token68}. Anything else (another scheme, no
    credential, two words, non-ASCII) is L{None}.
    """
    if header is None:
        return None
    if isinstance(header, bytes):
        try:
            header = header.decode("ascii")
        except UnicodeDecodeError:
            return None
    parts = header.strip(" \t").split(None, 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    credential = parts[1].strip(" \t")
    if not credential.isascii() or TOKEN68_PATTERN.fullmatch(credential) is None:
        return None
    return credential


def check_json_content_type(header: str | bytes | None) -> None:
    """
    Refuse a request body whose C{Content-Type} is not C{application/json}.

    The media type matches case-insensitively; parameters are allowed, but a
    C{charset} parameter must be C{utf-8}.

    @raise InvalidRequest: C{content_type_not_json}.
    """
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    if header is None:
        raise InvalidRequest(CONTENT_TYPE_NOT_JSON)
    media_type, *parameters = header.split(";")
    if media_type.strip().lower() != JSON_MEDIA_TYPE:
        raise InvalidRequest(CONTENT_TYPE_NOT_JSON)
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() != "utf-8":
            raise InvalidRequest(CONTENT_TYPE_NOT_JSON)


def check_declared_length(header: str | bytes | None, limit: int) -> None:
    """
    Refuse a body whose declared C{Content-Length} exceeds C{limit} before
    reading it.

    @raise InvalidRequest: C{body_too_large}, or a malformed length.
    """
    if header is None:
        return
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    if not header.isdigit():
        raise InvalidRequest("bad_content_length")
    if int(header) > limit:
        raise InvalidRequest(BODY_TOO_LARGE)


def parse_json_object(body: bytes, limit: int) -> dict[str, JsonValue]:
    """
    Parse a request body that must be one JSON object of at most C{limit}
    bytes, in UTF-8, without duplicate keys and without C{NaN}/C{Infinity}.

    @raise InvalidRequest: C{body_too_large}, C{body_not_json} or
        C{body_not_object}.
    """
    if len(body) > limit:
        raise InvalidRequest(BODY_TOO_LARGE)
    try:
        text = body.decode("utf-8")
        value = json.loads(
            text,
            object_pairs_hook=_object_without_duplicates,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
        )
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidRequest(BODY_NOT_JSON) from None
    if not isinstance(value, dict):
        raise InvalidRequest(BODY_NOT_OBJECT)
    return value


def _object_without_duplicates(pairs: list[tuple[str, JsonValue]]) -> dict[str, JsonValue]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate key in JSON object")
    return result


def _refuse_constant(name: str) -> JsonValue:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value
