"""
svc-mount: the mount client (FUSE filesystem backed by the data plane).
"""
