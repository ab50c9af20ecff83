"""
The host SDK: provision agents and their disks, mint enroll tokens, set
quotas and budgets and read usage on the control plane, with the Python
standard library only::

    from svc.sdk import Client

    client = Client("https://control.example.com", service_token)
    disk = client.allocate_disk("agent-7", "acme", 10 << 30)
    token = client.mint_enroll_token("agent-7")
    # run the mount client with disk.virtual_path and token.token

Every module of this package imports only the standard library and other
modules of this package. Reference: C{docs/specifications/sdk.md}.
"""

from svc.sdk.client import DEFAULT_TIMEOUT, DEFAULT_USER_AGENT, SDK_VERSION, Client
from svc.sdk.errors import (
    MAX_ERROR_BODY,
    NOT_FOUND,
    ErrorKind,
    Headers,
    InvalidResponse,
    RequestTimeout,
    SvcError,
    TransportError,
    VersionSkewError,
)
from svc.sdk.models import (
    DEFAULT_MOUNT_ROOT,
    AccountBudget,
    AccountEntity,
    AgentEntity,
    AgentUsage,
    AllocationSummary,
    EnrollToken,
    OwnerUsage,
)
from svc.sdk.retry import (
    RETRYABLE_STATUSES,
    backoff,
    is_retryable,
    parse_retry_after,
    retry_after,
    retry_delay,
)
from svc.sdk.transport import API_MAJOR, MAX_RESPONSE_BODY

__all__ = [
    "API_MAJOR",
    "DEFAULT_MOUNT_ROOT",
    "DEFAULT_TIMEOUT",
    "DEFAULT_USER_AGENT",
    "MAX_ERROR_BODY",
    "MAX_RESPONSE_BODY",
    "NOT_FOUND",
    "RETRYABLE_STATUSES",
    "SDK_VERSION",
    "AccountBudget",
    "AccountEntity",
    "AgentEntity",
    "AgentUsage",
    "AllocationSummary",
    "Client",
    "EnrollToken",
    "ErrorKind",
    "Headers",
    "InvalidResponse",
    "OwnerUsage",
    "RequestTimeout",
    "SvcError",
    "TransportError",
    "VersionSkewError",
    "backoff",
    "is_retryable",
    "parse_retry_after",
    "retry_after",
    "retry_delay",
]
