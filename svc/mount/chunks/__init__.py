"""
Chunk bytes on this machine: the on-disk chunk cache (its index, policy,
recency and disk steps), chunks kept for reads, and chunks carried inline.
"""
