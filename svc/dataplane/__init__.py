"""
svc-dataplane: the data-plane server (mutual-TLS chunk and manifest service).
"""
