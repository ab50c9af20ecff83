"""
Tests for L{svc.mount.runtime.settings} and the C{twist svc-mount} options.
"""

from __future__ import annotations

from pathlib import Path

from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase

from svc.mount.runtime.settings import SettingsError, settings_from
from svc.mount.tap import Options

ENV = {
    "SVC_CONTROL_URL": "http://control/",
    "SVC_ENROLL_TOKEN": "secret-token",
    "SVC_MOUNT_POINT": "/mnt/agent",
    "HOME": "/home/agent",
}


class SettingsTests(SynchronousTestCase):
    """Settings come from SVC_* variables, options win."""

    def test_from_environment(self) -> None:
        """The required variables suffice; the URL loses its trailing slash; the token hides."""
        settings = settings_from(ENV)
        self.assertEqual(settings.control_url, "http://control")
        self.assertEqual(settings.mount_point, Path("/mnt/agent"))
        self.assertFalse(settings.allow_other)
        self.assertFalse(settings.durable_close)
        self.assertNotIn("secret-token", repr(settings))

    def test_durable_close(self) -> None:
        """SVC_DURABLE_CLOSE turns durable closes on, as --durable-close does."""
        durable = settings_from({**ENV, "SVC_DURABLE_CLOSE": "yes"})
        self.assertTrue(durable.durable_close)
        self.assertTrue(durable.fs_settings.durable_close)
        self.assertFalse(settings_from({**ENV, "SVC_DURABLE_CLOSE": "0"}).fs_settings.durable_close)
        elsewhere = Path(self.mktemp())
        elsewhere.mkdir()
        options = Options(environ=dict(ENV))
        options.parseOptions(["--mount-point", str(elsewhere), "--durable-close"])
        assert options.settings is not None
        self.assertTrue(options.settings.durable_close)

    def test_write_leases(self) -> None:
        """Write leases are on unless SVC_MOUNT_WRITE_LEASES is off or --no-write-leases given."""
        self.assertTrue(settings_from(ENV).fs_settings.write_leases)
        self.assertTrue(settings_from({**ENV, "SVC_MOUNT_WRITE_LEASES": ""}).write_leases)
        off = settings_from({**ENV, "SVC_MOUNT_WRITE_LEASES": "0"})
        self.assertFalse(off.fs_settings.write_leases)
        elsewhere = Path(self.mktemp())
        elsewhere.mkdir()
        options = Options(environ=dict(ENV))
        options.parseOptions(["--mount-point", str(elsewhere), "--no-write-leases"])
        assert options.settings is not None
        self.assertFalse(options.settings.fs_settings.write_leases)

    def test_default_cache_root(self) -> None:
        """Without SVC_CACHE_DIR the cache is the spec's $XDG_CACHE_HOME/svc, else ~/.cache/svc."""
        self.assertEqual(settings_from(ENV).chunk_dir, Path("/home/agent/.cache/svc"))
        xdg = settings_from({**ENV, "XDG_CACHE_HOME": "/xdg"})
        self.assertEqual(xdg.chunk_dir, Path("/xdg/svc"))
        self.assertEqual(xdg.spill_dir, Path("/xdg/svc/spill"))
        env = {k: v for k, v in ENV.items() if k != "HOME"}
        with self.assertRaises(SettingsError) as raised:
            settings_from(env)
        self.assertIn("SVC_CACHE_DIR", str(raised.exception))

    def test_missing(self) -> None:
        """A missing required variable is refused by name."""
        env = dict(ENV)
        del env["SVC_MOUNT_POINT"]
        with self.assertRaises(SettingsError) as raised:
            settings_from(env)
        self.assertIn("SVC_MOUNT_POINT", str(raised.exception))

    def test_enroll_token_file(self) -> None:
        """SVC_ENROLL_TOKEN_FILE gives the token; with SVC_ENROLL_TOKEN too it is refused."""
        secret = Path(self.mktemp())
        secret.write_text("token-from-file\n")
        environ = {k: v for k, v in ENV.items() if k != "SVC_ENROLL_TOKEN"}
        settings = settings_from({**environ, "SVC_ENROLL_TOKEN_FILE": str(secret)})
        self.assertEqual(settings.enroll_token, "token-from-file")
        error = self.assertRaises(
            SettingsError, settings_from, {**ENV, "SVC_ENROLL_TOKEN_FILE": str(secret)}
        )
        self.assertIn("SVC_ENROLL_TOKEN_FILE", str(error))

    def test_bad_workers(self) -> None:
        """SVC_FUSE_WORKERS must be a positive integer."""
        for bad in ("x", "0"):
            with self.assertRaises(SettingsError):
                settings_from({**ENV, "SVC_FUSE_WORKERS": bad})

    def test_start_wait(self) -> None:
        """
        SVC_START_WAIT (or --start-wait) is how long a start keeps trying,
        60 s by default, a number of seconds from 0 to 3600.
        """
        self.assertEqual(settings_from(ENV).start_wait, 60.0)
        self.assertEqual(settings_from({**ENV, "SVC_START_WAIT": "2.5"}).start_wait, 2.5)
        for bad in ("soon", "-1", "3601", "nan"):
            with self.assertRaises(SettingsError) as raised:
                settings_from({**ENV, "SVC_START_WAIT": bad})
            self.assertEqual(raised.exception.variable, "SVC_START_WAIT")
        elsewhere = Path(self.mktemp())
        elsewhere.mkdir()
        options = Options(environ=dict(ENV))
        options.parseOptions(["--mount-point", str(elsewhere), "--start-wait", "5"])
        assert options.settings is not None
        self.assertEqual(options.settings.start_wait, 5.0)

    def test_options_override(self) -> None:
        """Command-line options override the environment; flags set allow_other and force."""
        elsewhere = Path(self.mktemp())
        elsewhere.mkdir()
        options = Options(environ=dict(ENV))
        options.parseOptions(
            ["--mount-point", str(elsewhere), "--cache-dir", "/c", "--allow-other", "--force"]
        )
        assert options.settings is not None
        self.assertEqual(options.settings.mount_point, elsewhere)
        self.assertEqual(options.settings.spill_dir, Path("/c/spill"))
        self.assertTrue(options.settings.allow_other)
        self.assertTrue(options.settings.force)

    def test_options_refuse(self) -> None:
        """Options without a control URL are a usage error."""
        options = Options(environ={})
        self.assertRaises(usage.UsageError, options.parseOptions, [])

    def test_mount_point_must_be_an_empty_directory(self) -> None:
        """
        A mount point holding files, missing, not a directory or already
        mounted is refused before enrolling, naming SVC_MOUNT_POINT and why.
        """
        point = Path(self.mktemp())
        point.mkdir()
        (point / "written-while-unmounted.txt").write_text("x")
        not_a_directory = Path(self.mktemp())
        not_a_directory.write_text("x")
        cases = {
            point: "written-while-unmounted.txt",
            Path(self.mktemp()): "No such file or directory",
            not_a_directory: "is not a directory",
            Path("/proc"): "already a mount point",
        }
        for path, why in cases.items():
            options = Options(environ={**ENV, "SVC_MOUNT_POINT": str(path)})
            with self.assertRaises(usage.UsageError) as raised:
                options.parseOptions([])
            self.assertIn("SVC_MOUNT_POINT", str(raised.exception))
            self.assertIn(why, str(raised.exception))
