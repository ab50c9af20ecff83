"""
Checks and arithmetic on the canonical absolute paths of a tenant namespace.

The data-plane server checks canonical form and agent confinement before it
calls the manifest store; the store checks the form again so that no caller
can plant a name that a second implementation would read differently.
"""

from __future__ import annotations

from svc.store.errors import InvalidArgument
from svc.wire.messages import MAX_NAME_BYTES, MAX_PATH_BYTES, MAX_SYMLINK_TARGET_BYTES

# The longest path (16384), component (255) and symlink target (4096), in
# UTF-8 bytes, are the wire's limits (one definition: svc.wire.messages).

ROOT = "/"


def check_path(path: str) -> str:
    """
    Return ``path`` if it is absolute and canonical: a leading C{/}, no
    empty, C{.} or C{..} components, no trailing slash except for the root,
    no NUL, components of at most 255 UTF-8 bytes and at most
    L{MAX_PATH_BYTES} in all.

    @raise InvalidArgument: otherwise.
    """
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidArgument("path must be absolute")
    if path == ROOT:
        return path
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("path is not valid UTF-8") from None
    if len(encoded) > MAX_PATH_BYTES:
        raise InvalidArgument("path too long")
    if b"\x00" in encoded:
        raise InvalidArgument("path contains NUL")
    for component in encoded[1:].split(b"/"):
        if component in (b"", b".", b".."):
            raise InvalidArgument("path is not canonical")
        if len(component) > MAX_NAME_BYTES:
            raise InvalidArgument("path component too long")
    return path


def parent_of(path: str) -> str:
    """
    The directory containing canonical ``path``; C{''} for the root.
    """
    if path == ROOT:
        return ""
    head = path.rsplit("/", 1)[0]
    return head or ROOT


def name_of(path: str) -> str:
    """
    The last component of canonical ``path``; C{''} for the root.
    """
    return path.rsplit("/", 1)[1]


def top_of(path: str) -> str:
    """
    The first component of canonical ``path`` (the agent disk it lies in);
    C{''} for the root.
    """
    return path[1:].split("/", 1)[0]


def child_path(directory: str, name: str) -> str:
    """
    The path of ``name`` inside canonical ``directory``.
    """
    return "/" + name if directory == ROOT else directory + "/" + name


def is_inside(path: str, ancestor: str) -> bool:
    """
    Whether ``path`` lies strictly below ``ancestor``.
    """
    if ancestor == ROOT:
        return path != ROOT
    return path.startswith(ancestor + "/")


def descendant_range(directory: str) -> tuple[str, str]:
    """
    Bounds ``(low, high)`` such that the paths strictly below ``directory``
    are exactly those with ``low <= path < high`` in binary (UTF-8 byte)
    order: C{'/'} is 0x2F and C{'0'} 0x30, so nothing sorts between
    C{dir + '/'} followed by anything and C{dir + '0'}. Used to select a
    subtree through the primary-key index without C{LIKE} escaping.
    """
    if directory == ROOT:
        return ("/\x01", "0")
    return (directory + "/", directory + "0")


def check_symlink_target(target: str) -> str:
    """
    Return ``target`` if it can be stored as a symlink target: non-empty,
    valid UTF-8, no NUL, at most 4096 bytes. It need not name anything.

    @raise InvalidArgument: otherwise.
    """
    if not isinstance(target, str) or target == "":
        raise InvalidArgument("symlink target must be a non-empty string")
    try:
        encoded = target.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("symlink target is not valid UTF-8") from None
    if b"\x00" in encoded or len(encoded) > MAX_SYMLINK_TARGET_BYTES:
        raise InvalidArgument("bad symlink target")
    return target
