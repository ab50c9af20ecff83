"""
Instructions per small-file commit, counted (not timed): a figure that does
not move with the machine's load, for comparing two versions of the code.

Each workload runs in one Python process under C{valgrind --tool=callgrind},
once with 50 files of 4 KiB (start-up and warm-up) and once with
C{--files} more; the difference over C{--files} is the cost of one file
(repeatable to about 0.1% between runs). Workloads:

 - C{svc_mount_and_dataplane}: the mount's file-system core
   (L{svc.mount.fs.MountFS}) over the real data-plane service and storage
   engine in the same process (the unit tests' fixture: no FUSE, no TLS, no
   sockets): create, write 4 KiB, flush and release, with the default
   settings (the close hands its commit off; the chunk rides in the
   C{manifest_put}).
 - C{svc_dataplane}: the data-plane service alone, one C{manifest_put} with
   its chunk inline per file.
 - C{local_disk} (the reference, same interpreter): C{os.open}, C{os.write},
   C{os.close} of the same files on the local disk.

The time the machine spends waiting (fsync) is not counted; the kernel's
work is not counted either (callgrind counts user-space instructions).
Prints JSON. Needs valgrind (installed with apt-get when missing).

Usage: C{.venv/bin/python bench/commit_instructions.py [--files N]}
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from blake3 import blake3
from twisted.trial.unittest import SynchronousTestCase

from svc.dataplane.test.test_service_support import ServiceFixture
from svc.mount.fs import ROOT_INODE
from svc.mount.test.test_fs_support import CALLER, FSFixture

SIZE = 4096
WORKLOADS = ("svc_mount_and_dataplane", "svc_dataplane", "local_disk")


def _say(message: str) -> None:
    print(f"[bench/commit_instructions] {message}", file=sys.stderr, flush=True)


def ensure_valgrind() -> str:
    """Path of valgrind, installing the Debian package if missing."""
    found = shutil.which("valgrind")
    if found is None:
        _say("valgrind is missing: installing it (apt-get install -y valgrind)")
        subprocess.run(["apt-get", "install", "-y", "valgrind"], capture_output=True, check=False)
        found = shutil.which("valgrind")
    if found is None:
        raise SystemExit("valgrind is needed and could not be installed")
    return found


class _Host(SynchronousTestCase):
    """The test case the unit tests' fixtures expect (never run)."""

    def __init__(self) -> None:
        super().__init__("runTest")  # type: ignore[no-untyped-call]

    def runTest(self) -> None:
        """Never run: only hosts a fixture."""


def _payloads(count: int) -> list[bytes]:
    return [os.urandom(SIZE) for _ in range(count)]


def _mount_and_dataplane(files: int, scratch: Path) -> None:
    os.chdir(scratch)
    fixture = FSFixture(_Host())
    mount = fixture.mount()
    fs = mount.fs
    mount.ok(fs.mkdir(ROOT_INODE, b"d", 0o755, CALLER))
    directory = mount.lookup_path("d").ino
    for index, payload in enumerate(_payloads(50 + files)):
        name = f"f{index:06d}".encode()
        opened, _entry = mount.ok(fs.create(directory, name, 0o644, os.O_WRONLY, CALLER))
        mount.ok(fs.write(opened.fh, 0, payload, CALLER))
        mount.ok(fs.flush(opened.fh, CALLER))
        mount.ok(fs.release(opened.fh, CALLER))


def _dataplane(files: int, scratch: Path) -> None:
    os.chdir(scratch)
    fixture = ServiceFixture(_Host())
    agent = fixture.agent()
    agent.ok("dir_create", path="/agent-1/d", mode=0o755, mtime_ns=1)
    for index, payload in enumerate(_payloads(50 + files)):
        name = blake3(payload).hexdigest()
        agent.ok(
            "manifest_put",
            payload,
            path=f"/agent-1/d/f{index:06d}",
            expected_version=0,
            chunks=[[name, SIZE]],
            size=SIZE,
            mode=0o644,
            mtime_ns=1,
            inline=[name],
        )


def _local_disk(files: int, scratch: Path) -> None:
    for index, payload in enumerate(_payloads(50 + files)):
        fd = os.open(scratch / f"f{index:06d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, payload)
        os.close(fd)


_RUN = {
    "svc_mount_and_dataplane": _mount_and_dataplane,
    "svc_dataplane": _dataplane,
    "local_disk": _local_disk,
}


def count_instructions(valgrind: str, workload: str, files: int) -> int:
    """User-space instructions of one run of C{workload} with C{files} files."""
    with tempfile.TemporaryDirectory(prefix="svc-instructions-") as tmp:
        out = Path(tmp) / "callgrind.out"
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        command = [
            valgrind,
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--run",
            workload,
            "--files",
            str(files),
            "--scratch",
            str(scratch),
        ]
        environ = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, capture_output=True, text=True, env=environ, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{workload} failed under valgrind:\n{done.stderr[-3000:]}")
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            raise SystemExit(f"no instruction count from valgrind:\n{done.stderr[-3000:]}")
        return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=300, help="files per measured run")
    parser.add_argument("--run", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run is not None:
        _RUN[args.run](args.files, args.scratch)
        return 0
    valgrind = ensure_valgrind()
    started = time.monotonic()
    result: dict[str, Any] = {"files": args.files, "size": SIZE}
    for workload in WORKLOADS:
        _say(f"{workload}: {args.files} files under callgrind")
        empty = count_instructions(valgrind, workload, 0)
        full = count_instructions(valgrind, workload, args.files)
        result[workload] = {"instructions_per_file": round((full - empty) / args.files)}
    reference = result["local_disk"]["instructions_per_file"]
    result["ratios"] = {
        f"{workload}_vs_local_disk": round(result[workload]["instructions_per_file"] / reference, 1)
        for workload in WORKLOADS[:2]
    }
    result["runtime_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
