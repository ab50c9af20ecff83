"""
svc: persistent, per-tenant isolated storage for sandboxed AI agents.

This module must stay import-light: ``svc.sdk`` is used by hosts with only the
standard library installed, so nothing here may import Twisted or any other
third-party package.
"""

__version__ = "0.1.0"
