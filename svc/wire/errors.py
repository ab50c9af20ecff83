"""
The one exception the codec raises for anything that is not a valid frame.
"""

from __future__ import annotations


class CodecError(Exception):
    """
    Bytes (or a value) that break the wire format.

    Raised by the decoder for every malformed input and by the encoder for a
    frame no peer would accept. A receiver that sees one drops the connection.

    @ivar reason: a short human-readable statement of what was wrong; safe to
        log, never sent to the peer verbatim.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
