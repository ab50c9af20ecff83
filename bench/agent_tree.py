"""
Real agent workloads on one target, for C{bench/mount.py} (issue 36).

A real source tree, the Twisted package the bench runs on (its
C{__pycache__} directories left out), is packed once into a tarball in the
bench's temporary directory (L{build_tarball}); on each target
L{agent_tree} then unpacks it with C{tar -x}, commits it to a new git
repository, searches it with C{grep -r} (warm), searches it again and runs
C{git status} on a fresh client (the caller's C{cold}: an emptied page
cache, and for svc a remount with an empty cache), and removes it with
C{rm -rf}. Every step is a command an agent runs, timed from outside.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import twisted

PATTERN = "Deferred"
"""The fixed string C{grep -r} looks for (in about a quarter of the tree's files)."""

GREP = ["grep", "-r", "-F", "--exclude-dir=.git", PATTERN]
"""
C{.git} is left out, so that grep reads exactly the unpacked files. Its
output goes to a pipe the bench counts, not to C{/dev/null}: GNU grep
stops reading a file at its first match when its output is C{/dev/null}.
"""

GIT_IDENTITY = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]


class Tree(NamedTuple):
    """A packed source tree: its tarball, and how many lines C{grep} must find in it."""

    tarball: Path
    lines: int


def build_tarball(directory: Path) -> tuple[Tree, dict[str, Any]]:
    """
    Pack the Twisted package directory without its C{__pycache__}
    directories into C{directory}/tree.tar (uncompressed, so that unpacking
    measures the filesystem); with its source, files, directories, bytes
    and the lines of its files that contain PATTERN.
    """
    source = Path(twisted.__file__).parent
    tarball = directory / "tree.tar"
    pack = ["tar", "-c", "-f", str(tarball), "--exclude=__pycache__", "-C", str(source.parent)]
    subprocess.run([*pack, source.name], check=True)
    files = directories = size = lines = 0
    with tarfile.open(tarball) as archive:
        for member in archive:
            if member.isdir():
                directories += 1
            elif member.isfile():
                files += 1
                size += member.size
                content = archive.extractfile(member)
                assert content is not None
                lines += sum(PATTERN.encode() in line for line in content.read().split(b"\n"))
    return Tree(tarball, lines), {
        "source": str(source),
        "files": files,
        "directories": directories,
        "bytes": size,
        "tarball_bytes": tarball.stat().st_size,
        "grep_pattern": PATTERN,
        "grep_matching_lines": lines,
    }


def _timed(command: list[str], cwd: Path | None = None) -> tuple[float, bytes]:
    """Run C{command} (it must succeed); seconds, and its standard output."""
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=cwd, stdout=subprocess.PIPE, env={**os.environ, "LC_ALL": "C"}, check=True
    )
    return time.perf_counter() - start, done.stdout


def tree_extract(tarball: Path, directory: Path) -> tuple[float, Path]:
    """Seconds for C{tar -x} of C{tarball} into C{directory}, and the tree's root."""
    directory.mkdir()
    elapsed, _ = _timed(["tar", "-x", "-f", str(tarball), "-C", str(directory)])
    (root,) = directory.iterdir()
    return elapsed, root


def tree_git_commit(tree: Path, git: str) -> float:
    """Seconds for C{git init}, C{git add -A} and C{git commit} of C{tree}."""
    start = time.perf_counter()
    for command in (["init", "-q"], ["add", "-A"], [*GIT_IDENTITY, "commit", "-q", "-m", "tree"]):
        subprocess.run([git, *command], cwd=tree, check=True)
    return time.perf_counter() - start


def tree_grep(tree: Path, expected: int) -> float:
    """Seconds for C{grep -r} of PATTERN over C{tree}; it must find C{expected} lines."""
    elapsed, found = _timed([*GREP, str(tree)])
    lines = found.count(b"\n")
    if lines != expected:
        raise SystemExit(f"{tree}: grep found {lines} lines, expected {expected}")
    return elapsed


def tree_git_status(tree: Path, git: str) -> float:
    """Seconds for C{git status} of C{tree}, which must be clean."""
    elapsed, changed = _timed([git, "status", "--porcelain"], tree)
    if changed:
        raise SystemExit(f"{tree}: git status not clean:\n{changed.decode(errors='replace')}")
    return elapsed


def tree_remove(directory: Path) -> float:
    """Seconds for C{rm -rf} of C{directory}."""
    elapsed, _ = _timed(["rm", "-rf", str(directory)])
    if directory.exists():
        raise SystemExit(f"{directory}: still there after rm -rf")
    return elapsed


def agent_tree(directory: Path, tree: Tree, cold: Callable[[], None]) -> dict[str, float | None]:
    """
    The steps in C{directory}: unpack, commit, warm C{grep -r} (the first
    run untimed), C{cold} (a fresh client), C{grep -r} and C{git status}
    again, C{cold} once more and C{git status} first, remove. Seconds per
    step; the git steps L{None} without git.
    """
    git = shutil.which("git")
    extracted, root = tree_extract(tree.tarball, directory)
    committed = None if git is None else tree_git_commit(root, git)
    tree_grep(root, tree.lines)
    warm = tree_grep(root, tree.lines)
    cold()
    cold_grep = tree_grep(root, tree.lines)
    status = None if git is None else tree_git_status(root, git)
    # The next fresh client: git status first, with the index the last one
    # refreshed (a client that numbers inodes its own way re-hashes every file).
    cold()
    status_again = None if git is None else tree_git_status(root, git)
    removed = tree_remove(directory)
    return {
        "extract_s": round(extracted, 3),
        "git_init_add_commit_s": None if committed is None else round(committed, 3),
        "grep_warm_s": round(warm, 3),
        "cold_grep_s": round(cold_grep, 3),
        "cold_git_status_s": None if status is None else round(status, 3),
        "next_cold_git_status_s": None if status_again is None else round(status_again, 3),
        "remove_s": round(removed, 3),
    }
