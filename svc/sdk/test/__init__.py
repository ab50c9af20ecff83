"""
Unit tests for svc.sdk.
"""
