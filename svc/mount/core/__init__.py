"""
The mount's local picture of the tree: names and attributes (inodes), open
files and their contents (spill files, extents, file state), the namespace lock
and the errors the filesystem answers with.
"""
