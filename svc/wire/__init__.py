"""
The data-plane wire format: frames, their codec and the operation names.

Pure code, no I/O and no reactor: L{svc.wire.frame} (the frame value, its
header and encoder), L{svc.wire.decoder} (the incremental decoder),
L{svc.wire.payload} (the msgpack profile), L{svc.wire.control} (HELLO, ERROR
and GOAWAY payloads), L{svc.wire.ops} (operation names),
L{svc.wire.correlation} (client-side request ids) and L{svc.wire.errno}.
The byte-exact format is C{docs/specifications/wire.md}.
"""
