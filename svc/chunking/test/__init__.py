"""
Tests for L{svc.chunking}.
"""
