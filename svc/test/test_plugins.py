"""
Tests for the twist plugins in C{twisted/plugins/svc_plugins.py} and the parts' taps.
"""

from __future__ import annotations

import importlib

from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins
from twisted.trial.unittest import SynchronousTestCase

COMMANDS = {
    "svc-control": "svc.control.tap",
    "svc-dataplane": "svc.dataplane.tap",
    "svc-mount": "svc.mount.tap",
}


class PluginTests(SynchronousTestCase):
    """
    The plugin scan finds exactly our three service makers.
    """

    def test_three_service_makers(self) -> None:
        """twist can see svc-control, svc-dataplane and svc-mount, each with its tap."""
        found = {
            maker.tapname: maker.module
            for maker in getPlugins(IServiceMaker)
            if maker.tapname.startswith("svc-")
        }
        self.assertEqual(found, COMMANDS)

    def test_lazy(self) -> None:
        """The plugin module itself imports no svc code, keeping the scan cheap."""
        source = importlib.import_module("twisted.plugins.svc_plugins").__file__
        assert source is not None
        with open(source) as f:
            text = f.read()
        self.assertNotIn("import svc", text)
        self.assertNotIn("from svc", text)
