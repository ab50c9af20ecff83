"""
The mount client through the kernel against the local disk and a bindfs
pass-through FUSE mount (the FUSE floor), measured in the same run.

Brings up the quickstart stack in a temporary directory, stops the
quickstart's own mount and runs its own C{twist svc-mount} with a fresh
cache; a cold read remounts with another empty cache, and so does a cold
read of the small files once they are written (then removed, timed as
C{rm -r}); the small-file test then runs ROUNDS more times on bindfs and
svc alternately (the median ratio of those pairs is the steadier figure),
and once more on a mount started with C{SVC_DURABLE_CLOSE=1} (every close
waits for its commit's answer).

Each target also runs the real agent workloads of issue 36 (module
C{agent_tree}, next to this one) on a real source tree, the Twisted package
this interpreter imports without its C{__pycache__} directories, packed
into a tarball at the start: C{tar -x}, C{git init && git add -A && git
commit}, a warm C{grep -r}, and on a fresh client (for svc a remount with
an empty cache, elsewhere an emptied page cache) C{grep -r} and
C{git status}, then C{rm -rf}. Prints one JSON object.
Everything started is stopped and unmounted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_tree import Tree, agent_tree, build_tarball  # noqa: E402

from svc.quickstart import DEMO_AGENT, DEMO_GRANT, http  # noqa: E402
from svc.quickstart_stack import Stack, run_quickstart  # noqa: E402

BIN = Path(sys.executable).parent
MIB = 1 << 20
SMALL_FILES = 2000
SMALL_SIZE = 4096
MOUNT_TIMEOUT = 60.0
WARM_READS = 5
ROUNDS = 5
"""Interleaved small-file rounds, bindfs and svc alternately (the machine is noisy)."""


def _say(message: str) -> None:
    print(f"[bench/mount] {message}", file=sys.stderr, flush=True)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def umount_lazy(path: Path) -> None:
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", str(path)], check=False)


# Workloads


def seq_write(path: Path, data: memoryview) -> tuple[float, float]:
    """
    Write C{data} in 1 MiB os.write calls, fsync and close; seconds in all,
    and of them seconds in the fsync and close.
    """
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for offset in range(0, len(data), MIB):
            block = data[offset : offset + MIB]
            while block:
                block = block[os.write(fd, block) :]
        written = time.perf_counter()
        os.fsync(fd)
    finally:
        os.close(fd)
    done = time.perf_counter()
    return done - start, done - written


def seq_read(path: Path, expected: int) -> float:
    """Read the whole file in 1 MiB readinto calls; seconds."""
    buffer = bytearray(MIB)
    total = 0
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while True:
            got = handle.readinto(buffer)
            if not got:
                break
            total += got
    elapsed = time.perf_counter() - start
    if total != expected:
        raise SystemExit(f"{path}: read {total} bytes, expected {expected}")
    return elapsed


def cpu_seconds() -> tuple[float, float, float]:
    """
    Machine-wide CPU seconds so far from C{/proc/stat}: (busy, all, stolen),
    summed over every CPU. Busy is user, nice, system, irq and softirq;
    stolen is the time the hypervisor ran something else on our CPUs
    (counted in all, not in busy: since 2026-11-27, session 13; before, it
    was counted as busy). The guest fields are part of user and nice already.
    """
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    tick = os.sysconf("SC_CLK_TCK")
    busy = user + nice + system + irq + softirq
    return busy / tick, (busy + idle + iowait + steal) / tick, steal / tick


def small_files(directory: Path) -> dict[str, float]:
    """
    Create+write+close, stat and read back SMALL_FILES files of SMALL_SIZE
    bytes; with the machine's CPU time per file over the whole workload
    (every process and the kernel: the bench itself, the FUSE server, for
    svc the data plane too), and how busy the CPUs were meanwhile.
    """
    directory.mkdir()
    payloads = [os.urandom(SMALL_SIZE) for _ in range(SMALL_FILES)]
    names = [str(directory / f"f{index:05d}") for index in range(SMALL_FILES)]
    busy_before, all_before, stolen_before = cpu_seconds()
    start = time.perf_counter()
    for name, payload in zip(names, payloads, strict=True):
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, payload)
        os.close(fd)
    created = time.perf_counter()
    for name in names:
        os.stat(name)
    statted = time.perf_counter()
    for name, payload in zip(names, payloads, strict=True):
        fd = os.open(name, os.O_RDONLY)
        got = os.read(fd, SMALL_SIZE + 1)
        os.close(fd)
        if got != payload:
            raise SystemExit(f"{name}: content differs")
    done = time.perf_counter()
    busy_after, all_after, stolen_after = cpu_seconds()
    busy = busy_after - busy_before
    elapsed_all = max(all_after - all_before, 1e-9)
    return {
        "create_s": round(created - start, 3),
        "stat_s": round(statted - created, 3),
        "read_s": round(done - statted, 3),
        "total_s": round(done - start, 3),
        "cpu_ms_per_file": round(busy * 1000 / SMALL_FILES, 3),
        "cpu_busy_fraction": round(busy / elapsed_all, 3),
        "cpu_stolen_fraction": round((stolen_after - stolen_before) / elapsed_all, 3),
    }


def cold_small_reads(directory: Path) -> float:
    """
    Seconds to open and read every file of C{directory} (the small files,
    written earlier) once, after the caches were emptied: what C{grep -r}
    or a program's imports cost on a fresh machine.
    """
    names = sorted(str(path) for path in directory.iterdir())
    start = time.perf_counter()
    for name in names:
        fd = os.open(name, os.O_RDONLY)
        got = os.read(fd, SMALL_SIZE + 1)
        os.close(fd)
        if len(got) != SMALL_SIZE:
            raise SystemExit(f"{name}: {len(got)} bytes, expected {SMALL_SIZE}")
    return time.perf_counter() - start


def chmod_after_close(directory: Path) -> float:
    """
    Seconds to write, close and then C{chmod} SMALL_FILES // 2 files of
    SMALL_SIZE bytes, as pip installs a package's scripts.
    """
    directory.mkdir()
    payload = os.urandom(SMALL_SIZE)
    names = [str(directory / f"s{index:05d}") for index in range(SMALL_FILES // 2)]
    start = time.perf_counter()
    for name in names:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, payload)
        os.close(fd)
        os.chmod(name, 0o755)
    elapsed = time.perf_counter() - start
    for name in names:
        if os.stat(name).st_mode & 0o777 != 0o755:
            raise SystemExit(f"{name}: mode not 0755")
    return elapsed


def rewrite_in_place(directory: Path) -> float:
    """
    Seconds to open each of the SMALL_FILES // 2 files C{chmod_after_close}
    left in C{directory} for writing, overwrite its SMALL_SIZE bytes and
    close it, as logs and databases are changed in place (on svc each such
    open takes the file's write lease first).
    """
    payload = os.urandom(SMALL_SIZE)
    names = sorted(str(path) for path in directory.iterdir())
    start = time.perf_counter()
    for name in names:
        fd = os.open(name, os.O_WRONLY)
        os.pwrite(fd, payload, 0)
        os.close(fd)
    elapsed = time.perf_counter() - start
    for name in names:
        with open(name, "rb") as check:
            if check.read() != payload:
                raise SystemExit(f"{name}: rewritten bytes not read back")
    return elapsed


def atomic_saves(directory: Path) -> float:
    """
    Seconds to save SMALL_FILES // 2 files of SMALL_SIZE bytes atomically,
    as editors, compilers, Python's byte code, pip and git do: write and
    close C{<name>.tmp}, then rename it over C{<name>} (each name saved
    twice, so half the renames replace a file).
    """
    directory.mkdir()
    payload = os.urandom(SMALL_SIZE)
    names = [str(directory / f"a{index:05d}") for index in range(SMALL_FILES // 4)]
    start = time.perf_counter()
    for name in names + names:
        fd = os.open(name + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, payload)
        os.close(fd)
        os.rename(name + ".tmp", name)
    elapsed = time.perf_counter() - start
    if sorted(os.listdir(directory)) != sorted(os.path.basename(name) for name in names):
        raise SystemExit(f"{directory}: atomic saves left other names")
    return elapsed


GIT_FILES = 300


def git_add_commit(directory: Path) -> float | None:
    """
    Seconds for C{git add -A} and C{git commit} of GIT_FILES small new files
    (git stores each object as a temporary file linked into place);
    L{None} without git.
    """
    git = shutil.which("git")
    if git is None:
        return None
    directory.mkdir()
    for index in range(GIT_FILES):
        (directory / f"d{index % 10}").mkdir(exist_ok=True)
        (directory / f"d{index % 10}" / f"f{index}.txt").write_text(f"file {index}\n" * 20)
    identity = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run([git, "init", "-q"], cwd=directory, check=True)
    start = time.perf_counter()
    subprocess.run([git, "add", "-A"], cwd=directory, check=True)
    subprocess.run([git, *identity, "commit", "-q", "-m", "bench"], cwd=directory, check=True)
    return time.perf_counter() - start


SQLITE_COMMITS = 200

SQLITE_MODES = {"delete_full": ("DELETE", "FULL"), "wal_normal": ("WAL", "NORMAL")}
"""SQLite's default (rollback journal, synchronous FULL) and the mode the
consistency guide recommends for databases that commit often."""


def sqlite_commits(directory: Path) -> dict[str, float]:
    """
    Milliseconds per SQLite transaction of one 100-byte row (SQLITE_COMMITS
    of them, one connection), in each of SQLITE_MODES: an agent's memory or
    task database. Every commit syncs the journal and the database (FULL)
    or only at checkpoints (WAL with NORMAL).
    """
    directory.mkdir()
    found: dict[str, float] = {}
    for label, (journal, synchronous) in SQLITE_MODES.items():
        connection = sqlite3.connect(directory / f"{label}.db", isolation_level=None)
        try:
            connection.execute(f"PRAGMA journal_mode={journal}")
            connection.execute(f"PRAGMA synchronous={synchronous}")
            connection.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, body BLOB)")
            start = time.perf_counter()
            for row in range(SQLITE_COMMITS):
                connection.execute("BEGIN")
                connection.execute("INSERT INTO rows VALUES (?, ?)", (row, b"x" * 100))
                connection.execute("COMMIT")
            elapsed = time.perf_counter() - start
            if connection.execute("PRAGMA integrity_check").fetchall() != [("ok",)]:
                raise SystemExit(f"{directory}: {label} database fails its integrity check")
        finally:
            connection.close()
        found[f"{label}_ms_per_commit"] = round(elapsed * 1000 / SQLITE_COMMITS, 3)
    return found


def run_target(
    directory: Path,
    data: memoryview,
    cold_prepare: Callable[[], None],
    tree: Tree,
) -> dict[str, Any]:
    """
    All workloads in C{directory}; C{cold_prepare} empties caches (after
    drop_caches); C{tree} is the source tree L{build_tarball} packed.
    """
    size = len(data)
    big = directory / "big.bin"
    write_s, fsync_s = seq_write(big, data)
    drop_caches()
    cold_prepare()
    cold_s = seq_read(big, size)
    # From the page cache a 1 GiB read takes tens of milliseconds, so a single
    # one is mostly noise on a shared VM: the best of WARM_READS.
    warm_s = min(seq_read(big, size) for _ in range(WARM_READS))
    small = small_files(directory / "small")
    drop_caches()
    cold_prepare()
    small["cold_read_s"] = round(cold_small_reads(directory / "small"), 3)
    removing = time.perf_counter()
    shutil.rmtree(directory / "small")
    small["remove_s"] = round(time.perf_counter() - removing, 3)
    chmodded = chmod_after_close(directory / "chmod")
    rewritten = rewrite_in_place(directory / "chmod")
    saved = atomic_saves(directory / "saves")
    committed = git_add_commit(directory / "git")
    databases = sqlite_commits(directory / "sqlite")

    def cold() -> None:
        drop_caches()
        cold_prepare()

    _say("agent workloads on a real source tree")
    agent = agent_tree(directory / "tree", tree, cold)
    mb = size / 1e6
    return {
        "write_mb_s": round(mb / write_s, 1),
        "cold_read_mb_s": round(mb / cold_s, 1),
        "warm_read_mb_s": round(mb / warm_s, 1),
        "write_s": round(write_s, 3),
        "write_fsync_close_s": round(fsync_s, 3),
        "cold_read_s": round(cold_s, 3),
        "warm_read_s": round(warm_s, 3),
        "small_files": small,
        "chmod_after_close_s": round(chmodded, 3),
        "rewrite_in_place_s": round(rewritten, 3),
        "atomic_save_s": round(saved, 3),
        "git_add_commit_s": None if committed is None else round(committed, 3),
        "sqlite": databases,
        "agent_tree": agent,
    }


# The svc stack and mount


class SvcStack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.stack = tmp / "stack"
        self.mount_point = tmp / "svc-mnt"
        self.process: subprocess.Popen[bytes] | None = None
        self.mounts = 0
        self.state: dict[str, Any] = {}

    def quickstart(self, command: str) -> subprocess.CompletedProcess[str]:
        return run_quickstart(command, self.stack)

    def start(self, grant_bytes: int) -> None:
        started = self.quickstart("start")
        if started.returncode != 0:
            raise SystemExit(f"quickstart start failed:\n{started.stdout}{started.stderr}")
        self.state = json.loads((self.stack / "state.json").read_text())
        self._stop_quickstart_mount()
        if grant_bytes > DEMO_GRANT:  # the host's set_disk_quota, before the bench's mount
            control_url = f"http://127.0.0.1:{self.state['control_port']}"
            status, body = http(
                "PATCH",
                control_url + f"/v1/entities/agent/{DEMO_AGENT}",
                {"grant_bytes": grant_bytes},
                self.state["token"],
            )
            if status != 200:
                raise SystemExit(f"raising the demo agent's grant failed: {status} {body}")
        self.mount_point.mkdir()

    def _stop_quickstart_mount(self) -> None:
        Stack(self.stack).stop_process("mount")
        umount_lazy(Path(self.state["mount_point"]))

    def mount(self, *, durable_close: bool = False) -> None:
        """A fresh twist svc-mount with an empty cache directory."""
        self.mounts += 1
        control_url = f"http://127.0.0.1:{self.state['control_port']}"
        status, minted = http(
            "POST", control_url + f"/v1/agents/{DEMO_AGENT}/enroll-token", {}, self.state["token"]
        )
        if status != 200:
            raise SystemExit(f"enroll-token failed: {status} {minted}")
        log = self.tmp / f"mount-{self.mounts}.log"
        environ = {
            **os.environ,
            "SVC_CONTROL_URL": control_url,
            "SVC_ENROLL_TOKEN": minted["token"],
            "SVC_MOUNT_POINT": str(self.mount_point),
            "SVC_CACHE_DIR": str(self.tmp / f"cache-{self.mounts}"),
            "SVC_AUDIT_LOG": str(self.tmp / f"audit-{self.mounts}.jsonl"),
            "SVC_MOUNT_FORCE": "1",
            "SVC_DURABLE_CLOSE": "1" if durable_close else "0",
        }
        with log.open("wb") as output:
            self.process = subprocess.Popen(
                [str(BIN / "twist"), "--log-format=text", "svc-mount"],
                env=environ,
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(self.mount_point):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"no svc mount; log:\n{log.read_text(errors='replace')}")
            time.sleep(0.1)

    def unmount(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        umount_lazy(self.mount_point)

    def remount_cold(self) -> None:
        self.unmount()
        self.mount()

    def pids(self) -> dict[str, int]:
        """The running bench mount's and the stack's data plane's pids."""
        found = {"dataplane": Stack(self.stack).running("dataplane")}
        if self.process is not None:
            found["mount"] = self.process.pid
        return {name: pid for name, pid in found.items() if pid is not None}

    def stop(self) -> None:
        self.unmount()
        self.quickstart("stop")
        state_file = self.stack / "state.json"
        if state_file.exists():
            mount_point = json.loads(state_file.read_text()).get("mount_point")
            if mount_point:
                umount_lazy(Path(mount_point))


def ensure_bindfs() -> str | None:
    """Path of bindfs, installing the Debian package if missing; None when unavailable."""
    found = shutil.which("bindfs")
    if found:
        return found
    _say("bindfs is missing: installing it (apt-get install -y bindfs)")
    subprocess.run(["apt-get", "install", "-y", "bindfs"], capture_output=True, check=False)
    return shutil.which("bindfs")


def interleaved_small_files(bind_mnt: Path | None, svc: SvcStack) -> list[dict[str, float]]:
    """
    The small-file test ROUNDS more times on bindfs and the svc mount
    alternately (which goes first alternates too), each in a fresh
    directory: this machine's speed drifts within a run, so a ratio of two
    runs minutes apart can be far off; the median of these pairs is the
    figure to judge the target by. Each round notes the CPU time the
    hypervisor took from each side (C{*_cpu_stolen_fraction}): on a busy
    host it slows the side with more work to do (svc) far more than the
    other. The directories are kept until the end:
    removing 2,000 files from bindfs's backing directory (ext4 mounted with
    C{discard} here) slowed its next round's creates, up to threefold by
    the fifth, while removing them from svc costs the disk nothing yet.
    """
    rounds: list[dict[str, float]] = []
    if bind_mnt is None:
        return rounds
    for index in range(ROUNDS):
        _say(f"small files, interleaved round {index + 1} of {ROUNDS}")
        targets = [("bindfs", bind_mnt), ("svc", svc.mount_point)]
        if index % 2:
            targets.reverse()
        totals: dict[str, float] = {}
        for name, root in targets:
            measured = small_files(root / f"round-{index}")
            totals[f"{name}_total_s"] = measured["total_s"]
            totals[f"{name}_cpu_stolen_fraction"] = measured["cpu_stolen_fraction"]
        totals["ratio"] = ratio(totals["svc_total_s"], totals["bindfs_total_s"])
        rounds.append(totals)
    return rounds


def median(values: list[float]) -> float:
    """The median of C{values} (not empty)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return round((ordered[middle - 1] + ordered[middle]) / 2, 3)


def durable_close_small_files(svc: SvcStack) -> dict[str, Any]:
    """The small-file test on a mount whose every close waits for its commit."""
    _say("svc mount with SVC_DURABLE_CLOSE=1: small files")
    svc.unmount()
    svc.mount(durable_close=True)
    return {"small_files": small_files(svc.mount_point / "small-2")}


def ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 3) if denominator else 0.0


def ratios(
    local: dict[str, Any],
    bind: dict[str, Any],
    mounted: dict[str, Any],
    durable: dict[str, Any],
    rounds: list[dict[str, float]],
) -> dict[str, Any]:
    found = {
        "svc_warm_read_vs_local": ratio(mounted["warm_read_mb_s"], local["warm_read_mb_s"]),
        "target_warm_read_vs_local": 0.5,
        "svc_write_vs_local": ratio(mounted["write_mb_s"], local["write_mb_s"]),
        "target_write_vs_local": 0.3,
        "svc_cold_read_vs_local": ratio(mounted["cold_read_mb_s"], local["cold_read_mb_s"]),
    }
    for label in SQLITE_MODES:
        key = f"{label}_ms_per_commit"
        found[f"svc_sqlite_{label}_vs_local"] = ratio(mounted["sqlite"][key], local["sqlite"][key])
    found.update(agent_tree_ratios(mounted, local, "local"))
    if rounds:
        found["svc_small_files_vs_bindfs_median_of_rounds"] = median(
            [entry["ratio"] for entry in rounds]
        )
    if "small_files" in bind:
        found["svc_small_files_vs_bindfs"] = ratio(
            mounted["small_files"]["total_s"], bind["small_files"]["total_s"]
        )
        found["target_small_files_vs_bindfs_max"] = 3.0
        found["svc_chmod_after_close_vs_bindfs"] = ratio(
            mounted["chmod_after_close_s"], bind["chmod_after_close_s"]
        )
        found["svc_atomic_save_vs_bindfs"] = ratio(mounted["atomic_save_s"], bind["atomic_save_s"])
        found["svc_rewrite_in_place_vs_bindfs"] = ratio(
            mounted["rewrite_in_place_s"], bind["rewrite_in_place_s"]
        )
        if mounted["git_add_commit_s"] is not None:
            found["svc_git_add_commit_vs_bindfs"] = ratio(
                mounted["git_add_commit_s"], bind["git_add_commit_s"]
            )
        found["svc_small_files_cpu_vs_bindfs"] = ratio(
            mounted["small_files"]["cpu_ms_per_file"], bind["small_files"]["cpu_ms_per_file"]
        )
        found["svc_small_files_cold_read_vs_bindfs"] = ratio(
            mounted["small_files"]["cold_read_s"], bind["small_files"]["cold_read_s"]
        )
        found["svc_small_files_remove_vs_bindfs"] = ratio(
            mounted["small_files"]["remove_s"], bind["small_files"]["remove_s"]
        )
        found["svc_write_vs_bindfs"] = ratio(mounted["write_mb_s"], bind["write_mb_s"])
        found["svc_warm_read_vs_bindfs"] = ratio(mounted["warm_read_mb_s"], bind["warm_read_mb_s"])
        found["svc_durable_close_small_files_vs_bindfs"] = ratio(
            durable["small_files"]["total_s"], bind["small_files"]["total_s"]
        )
        for label in SQLITE_MODES:
            key = f"{label}_ms_per_commit"
            found[f"svc_sqlite_{label}_vs_bindfs"] = ratio(
                mounted["sqlite"][key], bind["sqlite"][key]
            )
        found.update(agent_tree_ratios(mounted, bind, "bindfs"))
    return found


def agent_tree_ratios(
    mounted: dict[str, Any], other: dict[str, Any], name: str
) -> dict[str, float]:
    """
    Time ratios of svc's agent-tree steps to C{other}'s (how many times
    longer on svc), as C{svc_agent_tree_<step>_vs_<name>}.
    """
    found = {}
    for key, seconds in mounted["agent_tree"].items():
        if seconds is not None:
            step = key.removesuffix("_s")
            found[f"svc_agent_tree_{step}_vs_{name}"] = ratio(seconds, other["agent_tree"][key])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=1024, help="the big file (issue: 1 GiB)")
    parser.add_argument("--skip-bindfs", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        raise SystemExit("needs root and /dev/fuse (FUSE mounts and drop_caches)")
    if args.size_mib < 1:
        raise SystemExit("--size-mib must be at least 1")
    # The agent's grant also holds the quickstart's files and the small files.
    grant = max(DEMO_GRANT, args.size_mib * MIB + 256 * MIB)
    began = time.perf_counter()
    size = args.size_mib * MIB
    data = memoryview(os.urandom(size))
    tmp = Path(tempfile.mkdtemp(prefix="svc-bench-mount-"))
    svc = SvcStack(tmp)
    bind_mnt = tmp / "bindfs-mnt"
    result: dict[str, Any] = {
        "size_mib": args.size_mib,
        "block_size": MIB,
        "small_files": {"count": SMALL_FILES, "size": SMALL_SIZE},
    }
    try:
        tree, result["agent_tree"] = build_tarball(tmp)
        local_dir = tmp / "local"
        local_dir.mkdir()
        _say("local disk")
        local = result["local"] = run_target(local_dir, data, lambda: None, tree)
        shutil.rmtree(local_dir)

        bindfs = None if args.skip_bindfs else ensure_bindfs()
        if bindfs is None:
            result["bindfs"] = {"unavailable": True}
        else:
            _say("bindfs pass-through")
            backing = tmp / "bindfs-backing"
            backing.mkdir()
            bind_mnt.mkdir()
            # big_writes: the FUSE floor moves writes in 128 KiB requests,
            # as the svc mount does (without it each write is cut to 4 KiB).
            subprocess.run([bindfs, "-o", "big_writes", str(backing), str(bind_mnt)], check=True)
            result["bindfs"] = run_target(bind_mnt, data, lambda: None, tree)
            # Kept mounted for the interleaved small-file rounds.

        _say("starting the svc stack (quickstart)")
        svc.start(grant)
        svc.mount()
        _say("svc mount")
        mounted = run_target(svc.mount_point, data, svc.remount_cold, tree)
        result["svc"] = mounted
        rounds = result["small_files_rounds"] = interleaved_small_files(
            None if bindfs is None else bind_mnt, svc
        )
        umount_lazy(bind_mnt)
        result["svc_durable_close"] = durable_close_small_files(svc)
    finally:
        svc.stop()
        umount_lazy(bind_mnt)
        shutil.rmtree(tmp, ignore_errors=True)

    result["ratios"] = ratios(local, result["bindfs"], mounted, result["svc_durable_close"], rounds)
    result["runtime_s"] = round(time.perf_counter() - began, 1)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
