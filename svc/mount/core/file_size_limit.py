"""
The largest file the mount lets a program make: what one commit can name.
Checked by a write (L{svc.mount.ops.file_writes.FileWrites.start_write} and
L{svc.mount.core.spill_writes.WriteGrant.accepts}) and by a truncate
(L{svc.mount.ops.attribute_updates.AttributeUpdates.setattr}).
"""

from __future__ import annotations

from svc.chunking import MAX_CHUNK_SIZE
from svc.mount.remote.data_plane import MANIFEST_CHUNK_LIMIT

MAX_FILE_BYTES = MANIFEST_CHUNK_LIMIT * MAX_CHUNK_SIZE
"""
The largest file a commit could name (12000 chunks of at most 16 MiB:
187.5 GiB): a write or truncate beyond it fails C{EFBIG} at once, instead
of being accepted and then refused whole by the write-back.
"""
