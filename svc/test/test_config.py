"""
Tests for L{svc.config}.
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.config import ConfigError, env_int, env_optional, env_path, env_str


class EnvStrTests(SynchronousTestCase):
    """
    Tests for L{env_str}.
    """

    def test_present(self) -> None:
        """A set variable's value is returned."""
        self.assertEqual(env_str({"SVC_X": "v"}, "SVC_X"), "v")

    def test_default(self) -> None:
        """A missing or empty variable falls back to the default."""
        self.assertEqual(env_str({}, "SVC_X", "d"), "d")
        self.assertEqual(env_str({"SVC_X": ""}, "SVC_X", "d"), "d")

    def test_required_missing_names_variable(self) -> None:
        """A missing required variable is a ConfigError naming it."""
        error = self.assertRaises(ConfigError, env_str, {}, "SVC_REQUIRED")
        self.assertEqual(error.variable, "SVC_REQUIRED")
        self.assertIn("SVC_REQUIRED", str(error))


class EnvIntTests(SynchronousTestCase):
    """
    Tests for L{env_int}.
    """

    def test_parses(self) -> None:
        """A decimal integer is parsed."""
        self.assertEqual(env_int({"SVC_N": "42"}, "SVC_N", 1), 42)

    def test_default(self) -> None:
        """A missing variable gives the default."""
        self.assertEqual(env_int({}, "SVC_N", 7), 7)

    def test_garbage_refused(self) -> None:
        """A non-integer is a ConfigError naming the variable and the value."""
        error = self.assertRaises(ConfigError, env_int, {"SVC_N": "12x"}, "SVC_N", 1)
        self.assertEqual(error.variable, "SVC_N")
        self.assertIn("'12x'", str(error))

    def test_bounds(self) -> None:
        """Values outside [minimum, maximum] are refused."""
        self.assertRaises(ConfigError, env_int, {"SVC_N": "0"}, "SVC_N", 1, minimum=1)
        self.assertRaises(ConfigError, env_int, {"SVC_N": "11"}, "SVC_N", 1, maximum=10)
        self.assertEqual(env_int({"SVC_N": "10"}, "SVC_N", 1, minimum=1, maximum=10), 10)


class EnvOtherTests(SynchronousTestCase):
    """
    Tests for L{env_optional} and L{env_path}.
    """

    def test_optional(self) -> None:
        """Unset and empty both read as None."""
        self.assertIsNone(env_optional({}, "SVC_O"))
        self.assertIsNone(env_optional({"SVC_O": ""}, "SVC_O"))
        self.assertEqual(env_optional({"SVC_O": "x"}, "SVC_O"), "x")

    def test_path(self) -> None:
        """A path variable becomes a Path."""
        self.assertEqual(env_path({"SVC_P": "/a/b"}, "SVC_P"), Path("/a/b"))
