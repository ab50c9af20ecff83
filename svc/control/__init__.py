"""
svc-control: the control plane (provisioning, enrollment, CA, mount leases).
"""
