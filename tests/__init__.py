"""
System tests: real processes, real sockets, real files. Run with C{trial tests}.
"""
