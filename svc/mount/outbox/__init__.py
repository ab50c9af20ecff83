"""
The mount's outbox: one ordered, persisted log of the mutations it sends
the data plane (``docs/specifications/mount-outbox.md``).
"""
