"""
Unit tests for svc.control.
"""
