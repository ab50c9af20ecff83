"""
The data plane as the mount sees it: typed calls and their answers, namespace
changes, write leases, quota, pushes and outside changes, answers that never
came, hand-offs of namespace changes and counts of commits in flight.
"""
