"""
Building the outside suites from their read-only snapshots
(C{/work/shared/conformance} on the project's machines, see its README) into
a scratch directory: pjdfstest's C{pjdfstest} program, and C{ltp/fsx} and
C{ltp/fsstress} of xfstests. A build is kept with a stamp naming the
snapshot it came from (a digest of its files' names, sizes and mtimes), so a
rerun against the same snapshot builds nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs

PJDFSTEST_STEPS: tuple[tuple[str, ...], ...] = (
    ("autoreconf", "-ifs"),
    ("./configure",),
    ("make", "pjdfstest"),
)
XFSTESTS_STEPS: tuple[tuple[str, ...], ...] = (
    ("make", "configure"),
    ("./configure",),
    ("make", "-C", "lib"),
    ("make", "-C", "ltp", "fsx", "fsstress"),
)


class BuildError(Exception):
    """A snapshot is missing or a build step failed (the message says which, and its log)."""


@attrs.frozen
class Suites:
    """Where the built suites are."""

    pjdfstest_tests: Path
    """pjdfstest's C{tests} directory (the C{pjdfstest} program sits beside it)."""
    fsx: Path
    fsstress: Path


def snapshot_digest(source: Path) -> str:
    """A digest of every file's relative path, size and mtime under C{source}."""
    digest = hashlib.sha256()
    for directory, dirnames, filenames in os.walk(source):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(directory, name)
            st = path.lstat()
            digest.update(f"{path.relative_to(source)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _make_writable(root: Path) -> None:
    """The copy keeps the snapshot's read-only modes; the build writes into it."""
    for directory, _dirnames, filenames in os.walk(root):
        for path in [Path(directory), *(Path(directory, name) for name in filenames)]:
            st = path.lstat()
            if not stat.S_ISLNK(st.st_mode):
                path.chmod(stat.S_IMODE(st.st_mode) | stat.S_IWUSR)


def _say(message: str) -> None:
    print(f"[conformance] {message}", file=sys.stderr, flush=True)


def build_one(
    name: str,
    source: Path,
    scratch: Path,
    steps: Sequence[Sequence[str]],
    products: Sequence[str],
) -> Path:
    """
    Copy C{source} to C{scratch/name} and run C{steps} there, unless a build
    of the same snapshot with all its C{products} is there already. Returns
    the build's directory. Step output goes to C{scratch/name.log}.
    """
    if not source.is_dir():
        raise BuildError(f"no {name} snapshot at {source}")
    target = scratch / name
    stamp = scratch / f"{name}.stamp"
    log = scratch / f"{name}.log"
    digest = snapshot_digest(source)
    wanted = {"source": str(source), "digest": digest}
    if (
        stamp.exists()
        and json.loads(stamp.read_text()) == wanted
        and all((target / product).is_file() for product in products)
    ):
        _say(f"{name}: built already ({target})")
        return target
    _say(f"{name}: building from {source} in {target} (log: {log})")
    stamp.unlink(missing_ok=True)
    shutil.rmtree(target, ignore_errors=True)
    scratch.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target, symlinks=True)
    _make_writable(target)
    with log.open("w") as output:
        for step in steps:
            output.write(f"==> {' '.join(step)}\n")
            output.flush()
            done = subprocess.run(
                list(step), cwd=target, stdout=output, stderr=subprocess.STDOUT, check=False
            )
            if done.returncode != 0:
                raise BuildError(f"{name}: {' '.join(step)} failed ({done.returncode}); see {log}")
    missing = [product for product in products if not (target / product).is_file()]
    if missing:
        raise BuildError(f"{name}: the build made no {', '.join(missing)}; see {log}")
    stamp.write_text(json.dumps(wanted) + "\n")
    return target


def build_suites(snapshots: Path, scratch: Path) -> Suites:
    """Build (or find built) pjdfstest and fsx/fsstress from C{snapshots} in C{scratch}."""
    pjdfstest = build_one(
        "pjdfstest", snapshots / "pjdfstest", scratch, PJDFSTEST_STEPS, ["pjdfstest"]
    )
    xfstests = build_one(
        "xfstests", snapshots / "xfstests", scratch, XFSTESTS_STEPS, ["ltp/fsx", "ltp/fsstress"]
    )
    return Suites(
        pjdfstest_tests=pjdfstest / "tests",
        fsx=xfstests / "ltp" / "fsx",
        fsstress=xfstests / "ltp" / "fsstress",
    )
