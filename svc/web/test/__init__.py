"""Tests for L{svc.web}."""
