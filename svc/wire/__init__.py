"""
The data-plane wire format: frames, their codec, and the operations declared
once for both sides.

Pure code, no I/O and no reactor: L{svc.wire.frame} (the frame value, its
header and encoder), L{svc.wire.decoder} (the incremental decoder),
L{svc.wire.payload} (the msgpack profile), L{svc.wire.control} (HELLO, ERROR
and GOAWAY payloads), L{svc.wire.ops} (operation names),
L{svc.wire.correlation} (client-side request ids), L{svc.wire.errno}; and the
operations' contract: L{svc.wire.kinds} and L{svc.wire.schema} (field kinds,
the message codec), L{svc.wire.messages} and L{svc.wire.answers} (every
message), L{svc.wire.commands} (every operation) and L{svc.wire.contract}
(finding a request's operation, bounded decoding, answers and pushes).
The byte-exact format is C{docs/specifications/wire.md}.
"""
