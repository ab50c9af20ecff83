"""
Twisted plugins for the three svc processes: ``twist svc-control``,
``twist svc-dataplane`` and ``twist svc-mount``.

Each is a lazy L{ServiceMaker}: the plugin scan imports only this file, and
the part's ``tap`` module is imported when the command is actually run.
There is deliberately no ``__init__.py`` in ``twisted/plugins``.
"""

from twisted.application.service import ServiceMaker

svc_control = ServiceMaker(
    "svc control plane",
    "svc.control.tap",
    "svc control plane: provisioning, enrollment, CA and mount leases (HTTP/JSON).",
    "svc-control",
)

svc_dataplane = ServiceMaker(
    "svc data plane",
    "svc.dataplane.tap",
    "svc data-plane server: per-tenant chunks and manifests over mutual TLS 1.3.",
    "svc-dataplane",
)

svc_mount = ServiceMaker(
    "svc mount client",
    "svc.mount.tap",
    "svc mount client: the agent's persistent directory over FUSE.",
    "svc-mount",
)
