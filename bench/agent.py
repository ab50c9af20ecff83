"""
An agent's day on svc, the local disk and the FUSE floor, in alternated
rounds: issue 36's acceptance benchmark, one command, one JSON object.

Each round runs, on every target in turn (the order rotates from round to
round, since this machine's speed drifts within a run):

 - the real workloads of C{agent_tree} on a real source tree (the Twisted
   package this interpreter imports, without its C{__pycache__}
   directories, packed once into a tarball): C{tar -x}, C{git init && git
   add -A && git commit}, a warm C{grep -r}, on a fresh client C{grep -r}
   and C{git status}, on the next fresh client C{git status} first, and
   C{rm -rf};
 - C{--small-files} creates of 4 KiB files (open, write, close), as files
   per second, with (on svc) the CPU time per file of the mount and of the
   data-plane server;
 - a fresh client's sequential read of a C{--size-mib} file written once
   before the rounds.

A fresh client is an emptied page cache (C{drop_caches}) and, for svc, a new
C{twist svc-mount} with an empty chunk cache. The targets: the local disk,
C{bindfs -o big_writes} over a directory of it (the FUSE floor), and svc (the
quickstart's stack in a temporary directory, the bench's own mount).

The JSON gives every round's figures, the median of each step per target,
svc's ratio to bindfs per step (of the medians), the whole day (the
C{agent_tree} steps' sum, median of the rounds), and the issue's targets
with whether each is met: every step within 2x bindfs, the whole day within
1.5x, at least 1,500 creates per second, a fresh client's sequential read
at least 0.8 of bindfs's. Everything started is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_tree import Tree, agent_tree, build_tarball
from mount import (
    MIB,
    SvcStack,
    drop_caches,
    ensure_bindfs,
    median,
    ratio,
    seq_read,
    seq_write,
    umount_lazy,
)

from svc.quickstart import DEMO_GRANT  # importable once mount put the root on sys.path

CREATE_SIZE = 4096
NOT_DAY_STEPS = (
    "day_s",
    "creates_per_s",
    "creates_cpu_ms_per_file_mount",
    "creates_cpu_ms_per_file_dataplane",
    "cold_read_mb_s",
)
"""A round's figures that are not steps of the day (C{agent_tree}'s are)."""
TARGETS = {
    "every_step_vs_bindfs_max": 2.0,
    "whole_day_vs_bindfs_max": 1.5,
    "creates_per_s_min": 1500.0,
    "cold_read_vs_bindfs_min": 0.8,
}
"""Issue 36's acceptance targets."""


class Target:
    """One place the day runs: a directory, and how to make its client fresh."""

    def __init__(
        self,
        name: str,
        root: Path,
        fresh: Callable[[], None],
        processes: Callable[[], dict[str, int]] = dict,
    ) -> None:
        """
        @param processes: the pids of the processes serving the target, by
            name (svc's mount and data plane), whose CPU time per created
            file the round reports.
        """
        self.name = name
        self.root = root
        self._fresh = fresh
        self.processes = processes

    def cold(self) -> None:
        """A fresh client: the page cache emptied (and svc remounted with an empty cache)."""
        drop_caches()
        self._fresh()


def process_cpu_seconds(pid: int) -> float:
    """The user and system CPU seconds process C{pid} has used so far (C{/proc})."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def creates(directory: Path, count: int, processes: dict[str, int]) -> dict[str, float]:
    """
    Files of 4 KiB created per second (open, write, close), each its own
    content, the last one fsynced before its close: on svc every commit is
    then answered (the data plane runs one connection's commits in order),
    so the CPU time each of C{processes} used meanwhile, per file, is what
    creating and committing a small file costs it.
    """
    directory.mkdir()
    payloads = [os.urandom(CREATE_SIZE) for _ in range(count)]
    used = {name: process_cpu_seconds(pid) for name, pid in processes.items()}
    start = time.perf_counter()
    for index, payload in enumerate(payloads):
        fd = os.open(directory / f"f{index:05d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, payload)
        if index == count - 1:
            os.fsync(fd)
        os.close(fd)
    elapsed = time.perf_counter() - start
    found = {"creates_per_s": round(count / elapsed, 1)}
    for name, pid in processes.items():
        per_file = (process_cpu_seconds(pid) - used[name]) * 1000 / count
        found[f"creates_cpu_ms_per_file_{name}"] = round(per_file, 3)
    shutil.rmtree(directory)
    return found


def one_round(target: Target, index: int, tree: Tree, size: int, small: int) -> dict[str, Any]:
    """Every step of the day on C{target} in round C{index}."""
    _say(f"round {index + 1}: {target.name}")
    steps = agent_tree(target.root / f"tree-{index}", tree, target.cold)
    created = creates(target.root / f"creates-{index}", small, target.processes())
    target.cold()
    read_s = seq_read(target.root / "big.bin", size)
    day = [seconds for seconds in steps.values() if seconds is not None]
    return {
        **steps,
        "day_s": round(sum(day), 3),
        **created,
        "cold_read_mb_s": round(size / 1e6 / read_s, 1),
    }


def summary(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Medians per target and step, svc's ratios to bindfs, and the targets met."""
    medians: dict[str, dict[str, float]] = {}
    for name in rounds[0]:
        keys = rounds[0][name]
        medians[name] = {
            key: median([entry[name][key] for entry in rounds])
            for key in keys
            if all(entry[name][key] is not None for entry in rounds)
        }
    found: dict[str, Any] = {"medians": medians}
    svc, bind = medians.get("svc"), medians.get("bindfs")
    if svc is None or bind is None:
        return found
    steps = [key for key in svc if key not in NOT_DAY_STEPS and key in bind]
    vs_bindfs = {key.removesuffix("_s"): ratio(svc[key], bind[key]) for key in steps}
    vs_bindfs["day"] = ratio(svc["day_s"], bind["day_s"])
    vs_bindfs["cold_read_throughput"] = ratio(svc["cold_read_mb_s"], bind["cold_read_mb_s"])
    found["svc_vs_bindfs"] = vs_bindfs
    worst = max(vs_bindfs[key.removesuffix("_s")] for key in steps)
    found["targets"] = TARGETS
    found["met"] = {
        "every_step_within_2x_bindfs": worst <= TARGETS["every_step_vs_bindfs_max"],
        "whole_day_within_1_5x_bindfs": vs_bindfs["day"] <= TARGETS["whole_day_vs_bindfs_max"],
        "creates_per_s_at_least_1500": svc["creates_per_s"] >= TARGETS["creates_per_s_min"],
        "cold_read_at_least_0_8_of_bindfs": vs_bindfs["cold_read_throughput"]
        >= TARGETS["cold_read_vs_bindfs_min"],
    }
    found["svc_worst_step_vs_bindfs"] = worst
    return found


def _say(message: str) -> None:
    print(f"agent bench: {message}", file=sys.stderr, flush=True)


def _code() -> str | None:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=Path(__file__).resolve().parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (median)")
    parser.add_argument("--size-mib", type=int, default=1024, help="the file read cold (1 GiB)")
    parser.add_argument("--small-files", type=int, default=2000, help="4 KiB creates per round")
    parser.add_argument("--skip-bindfs", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        raise SystemExit("needs root and /dev/fuse (FUSE mounts and drop_caches)")
    if args.rounds < 1 or args.size_mib < 1 or args.small_files < 1:
        raise SystemExit("--rounds, --size-mib and --small-files must be at least 1")
    began = time.perf_counter()
    size = args.size_mib * MIB
    tmp = Path(tempfile.mkdtemp(prefix="svc-bench-agent-"))
    svc = SvcStack(tmp)
    bind_mnt = tmp / "bindfs-mnt"
    result: dict[str, Any] = {
        "code": _code(),
        "rounds_asked": args.rounds,
        "size_mib": args.size_mib,
        "small_files": {"count": args.small_files, "size": CREATE_SIZE},
    }
    try:
        tree, result["tree"] = build_tarball(tmp)
        local_dir = tmp / "local"
        local_dir.mkdir()
        targets = [Target("local", local_dir, lambda: None)]
        bindfs = None if args.skip_bindfs else ensure_bindfs()
        if bindfs is not None:
            backing = tmp / "bindfs-backing"
            backing.mkdir()
            bind_mnt.mkdir()
            subprocess.run([bindfs, "-o", "big_writes", str(backing), str(bind_mnt)], check=True)
            targets.append(Target("bindfs", bind_mnt, lambda: None))
        _say("starting the svc stack (quickstart)")
        svc.start(max(DEMO_GRANT, size + 1024 * MIB))
        svc.mount()
        targets.append(Target("svc", svc.mount_point, svc.remount_cold, svc.pids))
        data = memoryview(os.urandom(size))
        for target in targets:
            _say(f"writing the {args.size_mib} MiB file on {target.name}")
            seq_write(target.root / "big.bin", data)
        del data
        rounds: list[dict[str, dict[str, Any]]] = []
        for index in range(args.rounds):
            turn = index % len(targets)
            order = targets[turn:] + targets[:turn]
            rounds.append(
                {
                    target.name: one_round(target, index, tree, size, args.small_files)
                    for target in order
                }
            )
        result["rounds"] = rounds
        result["round_orders"] = [list(entry) for entry in rounds]
        result.update(summary(rounds))
    finally:
        svc.stop()
        umount_lazy(bind_mnt)
        shutil.rmtree(tmp, ignore_errors=True)
    result["runtime_s"] = round(time.perf_counter() - began, 1)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
