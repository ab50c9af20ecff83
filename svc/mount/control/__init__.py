"""
The control plane as the mount sees it: enrollment, credentials and the
retried start.
"""
