"""
Outside conformance suites against a real svc mount (issue 35), in one run:

1. builds pjdfstest and fsx/fsstress from their read-only snapshots into
   the scratch directory (C{.conformance-build/}, kept for the next run);
2. starts the quickstart stack and a capped C{twist svc-mount} of our own;
3. runs pjdfstest (C{prove -r}) in a directory of the mount, fsx for each
   seed on another mount, and fsstress on a third, whose tree is compared
   with what a fresh mount (empty cache) of the same disk shows;
4. prints one JSON summary (also written to C{--output}) and exits 1 when a
   pjdfstest failure is not in the documented list (C{docs/conformance.md}),
   an fsx seed is not A-OK, or the trees differ.

Run as root through C{scripts/conformance}, which installs what it needs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .build import BuildError, Suites, build_suites, snapshot_digest
from .expected import ExpectedFailures, TableError, parse_table
from .report import pjdfstest_summary, verdict
from .stack import ROOT, ConformanceStack, StackError, umount_lazy
from .suites import run_fsstress, run_fsx, run_pjdfstest
from .tap import FileResult
from .tree import compare, snapshot

SUITES = ("pjdfstest", "fsx", "fsstress")
EXPECTED_DOC = ROOT / "docs" / "conformance.md"
GIB = 1 << 30


def _say(message: str) -> None:
    print(f"[conformance] {message}", file=sys.stderr, flush=True)


def _size(text: str) -> int:
    """C{4G}, C{512M} or a number of bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def checkout() -> dict[str, Any]:
    """The commit the run's svc came from, and which files under svc/ differ from it."""

    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout

    changed = git("status", "--porcelain", "--", "svc").splitlines()
    return {"head": git("rev-parse", "HEAD").strip(), "svc_changed": [line[3:] for line in changed]}


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/conformance", description=__doc__)
    parser.add_argument(
        "--snapshots",
        type=Path,
        default=Path(
            os.environ.get("SVC_CONFORMANCE_SNAPSHOTS", str(ROOT / ".." / "shared" / "conformance"))
        ),
        help="the read-only suite snapshots (env SVC_CONFORMANCE_SNAPSHOTS; "
        "default ../shared/conformance from the repository root)",
    )
    parser.add_argument(
        "--build-dir",
        type=Path,
        default=ROOT / ".conformance-build",
        help="scratch directory: the builds, the run's stack, mounts and logs",
    )
    parser.add_argument(
        "--output", type=Path, help="the JSON summary (default BUILD_DIR/summary.json)"
    )
    parser.add_argument(
        "--suites",
        default=",".join(SUITES),
        help="which to run, comma-separated: " + ", ".join(SUITES),
    )
    parser.add_argument(
        "--pjdfstest-tests",
        default="",
        help="only these paths under pjdfstest's tests/ (comma-separated, e.g. chmod,open/00.t)",
    )
    parser.add_argument(
        "--local-reference",
        action="store_true",
        help="also run pjdfstest in a local directory and mark failures seen there too",
    )
    parser.add_argument("--fsx-seeds", type=_numbers, default=[1, 2, 3])
    parser.add_argument("--fsx-ops", type=int, default=100_000)
    parser.add_argument("--fsstress-ops", type=int, default=10_000)
    parser.add_argument("--fsstress-procs", type=int, default=4)
    parser.add_argument("--fsstress-seed", type=int, default=1)
    parser.add_argument(
        "--memory-cap",
        type=_size,
        default=4 * GIB,
        help="address-space limit of each mount process (prlimit --as), e.g. 4G",
    )
    parser.add_argument(
        "--grant",
        type=_size,
        default=16 * GIB,
        help="the demo agent's grant for the run, e.g. 16G",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per suite run")
    parser.add_argument(
        "--keep-data",
        action="store_true",
        help="keep the stack's chunk store and the mounts' caches after the run "
        "(by default only logs, audit logs and the fsstress trees are kept)",
    )
    args = parser.parse_args(argv)
    args.suites = [name.strip() for name in args.suites.split(",") if name.strip()]
    unknown = set(args.suites) - set(SUITES)
    if unknown:
        parser.error(f"unknown suites: {', '.join(sorted(unknown))}")
    return args


def clear_run(run: Path) -> None:
    """Stop what an earlier run left (stack, mounts), then empty C{run}."""
    if (run / "stack" / "state.json").exists():
        subprocess.run(
            [sys.executable, "-m", "svc.quickstart", "stop", "--dir", str(run / "stack")],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
    prefix = str(run.resolve()) + "/"
    for line in Path("/proc/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point.startswith(prefix):
            umount_lazy(Path(point))
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)


def run_pjdfstest_suite(
    stack: ConformanceStack, suites: Suites, args: argparse.Namespace, expected: ExpectedFailures
) -> dict[str, Any]:
    tests = suites.pjdfstest_tests
    subset = [part.strip() for part in args.pjdfstest_tests.split(",") if part.strip()]
    local: list[FileResult] | None = None
    if args.local_reference:
        _say("pjdfstest in a local directory (the reference)")
        logs = stack.run / "local"
        logs.mkdir()
        local, _ = run_pjdfstest(tests, subset, logs / "pjdfstest", logs, args.timeout)
    mount = stack.mount("pjdfstest")
    _say(f"pjdfstest on the mount (log: {stack.run / 'pjdfstest.log'})")
    results, run = run_pjdfstest(
        tests, subset, stack.mount_point / "pjdfstest", stack.run, args.timeout
    )
    run["mount_alive_after"] = mount.alive()
    stack.unmount(mount)
    summary = pjdfstest_summary(results, expected, local)
    summary["run"] = run
    return summary


def run_fsx_suite(
    stack: ConformanceStack, suites: Suites, args: argparse.Namespace
) -> dict[str, Any]:
    mount = stack.mount("fsx")
    directory = stack.mount_point / "fsx"
    directory.mkdir()
    seeds: dict[str, Any] = {}
    for seed in args.fsx_seeds:
        _say(f"fsx -N {args.fsx_ops} -S {seed}")
        logs = stack.run / "fsx"
        logs.mkdir(exist_ok=True)
        seeds[str(seed)] = run_fsx(
            suites.fsx, directory / f"fsx-{seed}", seed, args.fsx_ops, logs, args.timeout
        )
        seeds[str(seed)]["mount_alive_after"] = mount.alive()
        if not mount.alive():
            break
    stack.unmount(mount)
    passed = sum(1 for seed in seeds.values() if seed["ok"])
    # What fsx turned off is the same for every seed: said once, unless a seed differs.
    remarks = next(iter(seeds.values()))["remarks"] if seeds else []
    for seed in seeds.values():
        if seed["remarks"] == remarks:
            del seed["remarks"]
    return {
        "ops": args.fsx_ops,
        "passed": passed,
        "failed": len(args.fsx_seeds) - passed,
        "remarks": remarks,
        "seeds": seeds,
    }


def run_fsstress_suite(
    stack: ConformanceStack, suites: Suites, args: argparse.Namespace
) -> dict[str, Any]:
    mount = stack.mount("fsstress")
    target = stack.mount_point / "fsstress"
    _say(f"fsstress -n {args.fsstress_ops} -p {args.fsstress_procs} -s {args.fsstress_seed}")
    run = run_fsstress(
        suites.fsstress,
        target,
        args.fsstress_ops,
        args.fsstress_procs,
        args.fsstress_seed,
        stack.run,
        args.timeout,
    )
    _say("recording the tree the mount shows, then unmounting")
    before = snapshot(target)
    run["mount_alive_after"] = mount.alive()
    stack.unmount(mount)
    _say("a fresh mount (empty cache) of the same disk: recording its tree")
    fresh = stack.mount("fsstress-fresh")
    after = snapshot(target)
    stack.unmount(fresh)
    for name, tree in (("before", before), ("after", after)):
        (stack.run / f"fsstress-tree-{name}.json").write_text(json.dumps(tree.to_json(), indent=1))
    comparison = compare(before, after)
    return {
        "ops": args.fsstress_ops,
        "procs": args.fsstress_procs,
        "seed": args.fsstress_seed,
        "run": run,
        "tree_identical": comparison["identical"],
        "tree": comparison,
    }


def cannot_start(message: str) -> int:
    """Say why the run cannot start; its exit status, 2 (1 is a run that failed)."""
    print(f"scripts/conformance: {message}", file=sys.stderr, flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        return cannot_start("needs root and /dev/fuse")
    try:
        expected = ExpectedFailures(parse_table(EXPECTED_DOC.read_text()))
    except (OSError, TableError) as error:
        return cannot_start(f"the expected-failure table in {EXPECTED_DOC}: {error}")
    build_dir = args.build_dir.resolve()
    snapshots = args.snapshots.resolve()
    try:
        suites = build_suites(snapshots, build_dir)
    except BuildError as error:
        return cannot_start(str(error))
    run = build_dir / "run"
    clear_run(run)
    stack = ConformanceStack(run, args.memory_cap, args.grant)
    began = time.monotonic()
    summary: dict[str, Any] = {
        "snapshots": {"path": str(snapshots), "digest": snapshot_digest(snapshots)},
        "checkout": checkout(),
        "memory_cap_bytes": args.memory_cap,
        "grant_bytes": args.grant,
        "run_dir": str(run),
        "errors": [],
    }
    try:
        _say("starting the stack (quickstart)")
        stack.start()
        for name in args.suites:
            try:
                if name == "pjdfstest":
                    summary[name] = run_pjdfstest_suite(stack, suites, args, expected)
                elif name == "fsx":
                    summary[name] = run_fsx_suite(stack, suites, args)
                else:
                    summary[name] = run_fsstress_suite(stack, suites, args)
            except (StackError, OSError) as error:
                # A mount that did not start, or died under the tree walk.
                summary["errors"].append(f"{name}: {error}"[:2000])
                stack.stop_mounts()
    except StackError as error:
        summary["errors"].append(str(error)[:2000])
    finally:
        stack.stop()
        if not args.keep_data:
            # fsstress leaves about 20 GB of chunks (every version it committed).
            shutil.rmtree(run / "stack" / "tenants", ignore_errors=True)
            for cache in run.glob("cache-*"):
                shutil.rmtree(cache, ignore_errors=True)
    summary["mounts"] = [mount.report() for mount in stack.mounts]
    summary["seconds"] = round(time.monotonic() - began, 1)
    problems = verdict(summary)
    summary["ok"] = not problems
    summary["problems"] = problems
    output = args.output or build_dir / "summary.json"
    text = json.dumps(summary, indent=2)
    output.write_text(text + "\n")
    print(text, flush=True)
    _say(f"summary written to {output}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
