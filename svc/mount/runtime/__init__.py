"""
The mount process: FUSE threads and their hand-off to the reactor, kernel
notices, the mount point, the FUSE loop, the service and its settings.
"""
