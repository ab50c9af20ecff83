"""
Tests for L{svc.config}.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from svc.config import (
    MAX_SECRET_FILE_BYTES,
    ConfigError,
    env_int,
    env_optional,
    env_path,
    env_str,
    secret_source,
    with_secret_files,
)


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


class SecretFileTests(SynchronousTestCase):
    """
    Tests for L{with_secret_files} and L{secret_source}: C{NAME_FILE}
    variants of the secret variables.
    """

    def files(self, contents: dict[str, bytes]) -> tuple[list[Path], Callable[[Path], bytes]]:
        read: list[Path] = []

        def read_file(path: Path) -> bytes:
            read.append(path)
            if str(path) not in contents:
                raise FileNotFoundError(2, "No such file or directory", str(path))
            return contents[str(path)]

        return read, read_file

    def test_value_read_from_the_file(self) -> None:
        """NAME_FILE's text, whitespace and the trailing newline removed, becomes NAME."""
        read, read_file = self.files(
            {
                "/run/token": b"  t0ken-value\n",
                "/run/kek": b"a2VrCg==\r\n",
                "/run/db": b"postgres://svc:p%40ss@db/svc\n",
            }
        )
        environ = {
            "SVC_CONTROL_PLANE_TOKEN_FILE": "/run/token",
            "SVC_CA_KEK_FILE": "/run/kek",
            "DATABASE_URL_FILE": "/run/db",
            "OTHER": "kept",
        }
        resolved = with_secret_files(environ, read_file=read_file)
        self.assertEqual(resolved["SVC_CONTROL_PLANE_TOKEN"], "t0ken-value")
        self.assertEqual(resolved["SVC_CA_KEK"], "a2VrCg==")
        self.assertEqual(resolved["DATABASE_URL"], "postgres://svc:p%40ss@db/svc")
        self.assertEqual(resolved["OTHER"], "kept")
        self.assertEqual(environ.get("SVC_CA_KEK"), None)  # the input is not changed
        self.assertEqual(len(read), 3)

    def test_only_the_names_given(self) -> None:
        """A NAME_FILE not among the names asked for is not read."""
        read, read_file = self.files({})
        environ = {"DATABASE_URL_FILE": "/nope"}
        resolved = with_secret_files(environ, ("SVC_CONTROL_PLANE_TOKEN",), read_file)
        self.assertEqual((dict(resolved), read), (environ, []))

    def test_unset_and_empty_file_variables_ignored(self) -> None:
        """An unset or empty NAME_FILE leaves NAME as it is."""
        read, read_file = self.files({})
        environ = {"SVC_CA_KEK": "inline", "SVC_CONTROL_PLANE_TOKEN_FILE": ""}
        resolved = with_secret_files(environ, read_file=read_file)
        self.assertEqual((resolved["SVC_CA_KEK"], read), ("inline", []))

    def test_both_set_refused(self) -> None:
        """NAME and NAME_FILE both set is refused naming NAME_FILE."""
        _, read_file = self.files({"/k": b"x"})
        error = self.assertRaises(
            ConfigError,
            with_secret_files,
            {"SVC_CA_KEK": "a", "SVC_CA_KEK_FILE": "/k"},
            read_file=read_file,
        )
        self.assertEqual(error.variable, "SVC_CA_KEK_FILE")
        self.assertIn("not both", str(error))

    def test_bad_files_refused(self) -> None:
        """Missing, empty, oversized or non-UTF-8 files are refused naming NAME_FILE, the path."""
        _, read_file = self.files(
            {
                "/empty": b" \n",
                "/big": b"x" * (MAX_SECRET_FILE_BYTES + 1),
                "/binary": b"\xff\xfe",
            }
        )
        for path, problem in (
            ("/missing", "cannot read /missing: No such file or directory"),
            ("/empty", "/empty is empty"),
            ("/big", "/big is larger than"),
            ("/binary", "/binary is not UTF-8"),
        ):
            error = self.assertRaises(
                ConfigError,
                with_secret_files,
                {"DATABASE_URL_FILE": path},
                read_file=read_file,
            )
            self.assertEqual(error.variable, "DATABASE_URL_FILE")
            self.assertIn(problem, str(error))

    def test_real_file(self) -> None:
        """By default the file is read from disk."""
        secret = Path(self.mktemp())
        secret.write_text("from-disk\n")
        resolved = with_secret_files({"SVC_CONTROL_PLANE_TOKEN_FILE": str(secret)})
        self.assertEqual(resolved["SVC_CONTROL_PLANE_TOKEN"], "from-disk")

    def test_source(self) -> None:
        """secret_source names NAME_FILE when the value came from a file, else NAME."""
        self.assertEqual(secret_source({"SVC_CA_KEK": "a"}, "SVC_CA_KEK"), "SVC_CA_KEK")
        self.assertEqual(
            secret_source({"SVC_CA_KEK": "a", "SVC_CA_KEK_FILE": "/k"}, "SVC_CA_KEK"),
            "SVC_CA_KEK_FILE",
        )
