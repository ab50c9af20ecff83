"""
Getting a file's changes to the data plane: chunking and uploads, the
write-behind, the commit rule, closes that hand their commit off, write-backs
kept through an outage, unsent copies and the sync at shutdown.
"""
