"""
The filesystem operations over the mount's local picture: lookups, listings,
directories, creations, removals, renames, attribute updates, opens, writes,
closes, and what becomes of changes that could not be written back.
"""
