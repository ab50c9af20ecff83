"""
A program that changes a tree the way agents' tools do -- new files,
rewrites, atomic saves, renames, unlinks, mkdir and rmdir -- until a stop
file appears, keeping its own picture of what the tree must hold. Run by
L{tests.test_mount_reconnect} in a mount while the data plane is killed.

A call that fails (an answer the crash took that the mount could not
settle, or a close that could not commit) leaves the program unsure of
that path: it looks again at what the tree shows there, as a program that
checks after an error would. Everything else it believes must hold at the
end.

Usage: C{crash_workload.py ROOT STOP SEED RESULT}; writes RESULT (JSON): the
picture (C{path: "dir" or BLAKE3 hex of the content}), the number of
operations and of failed calls.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from blake3 import blake3

DIRECTORIES = ("", "a", "b", "a/c")
"""Where files live (created first; C{a/c} is also removed and made again)."""


def digest(data: bytes) -> str:
    return blake3(data).hexdigest()


class Workload:
    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.random = random.Random(seed)
        self.picture: dict[str, str] = {}
        self.operations = 0
        self.failures = 0
        self.serial = 0

    def path(self, rel: str) -> Path:
        return self.root / rel if rel else self.root

    def body(self) -> bytes:
        self.serial += 1
        return f"{self.serial}\n".encode() * self.random.choice((1, 30, 600))

    def files(self) -> list[str]:
        return sorted(rel for rel, kind in self.picture.items() if kind != "dir")

    def folders(self) -> list[str]:
        return ["", *sorted(rel for rel, kind in self.picture.items() if kind == "dir")]

    def look_again(self, *rels: str) -> None:
        """After a failed call: believe what the tree shows at C{rels}."""
        for rel in rels:
            path = self.path(rel)
            if path.is_dir():
                self.picture[rel] = "dir"
            elif path.is_file():
                self.picture[rel] = digest(path.read_bytes())
            else:
                self.picture.pop(rel, None)
            temporary = Path(f"{path}.tmp")
            if temporary.exists():
                temporary.unlink()

    def step(self) -> None:
        choice = self.random.random()
        files = self.files()
        folder = self.random.choice(self.folders())
        new = f"{folder}/f{self.random.randrange(40)}".lstrip("/")
        if choice < 0.3 or not files:
            self.write(new)
        elif choice < 0.6:
            self.save(self.random.choice(files))
        elif choice < 0.75:
            self.rename(self.random.choice(files), new)
        elif choice < 0.9:
            self.unlink(self.random.choice(files))
        else:
            self.cycle_directory()

    def attempt(self, rels: tuple[str, ...], change: Callable[[], None]) -> None:
        self.operations += 1
        try:
            change()
        except OSError:
            self.failures += 1
            self.look_again(*rels)

    def write(self, rel: str) -> None:
        if self.picture.get(rel) == "dir":
            return
        data = self.body()

        def change() -> None:
            self.path(rel).write_bytes(data)
            self.picture[rel] = digest(data)

        self.attempt((rel,), change)

    def save(self, rel: str) -> None:
        data = self.body()

        def change() -> None:
            temporary = Path(f"{self.path(rel)}.tmp")
            temporary.write_bytes(data)
            os.rename(temporary, self.path(rel))
            self.picture[rel] = digest(data)

        self.attempt((rel,), change)

    def rename(self, rel: str, to: str) -> None:
        if rel == to or self.picture.get(to) == "dir":
            return

        def change() -> None:
            os.rename(self.path(rel), self.path(to))
            self.picture[to] = self.picture.pop(rel)

        self.attempt((rel, to), change)

    def unlink(self, rel: str) -> None:
        def change() -> None:
            self.path(rel).unlink()
            del self.picture[rel]

        self.attempt((rel,), change)

    def cycle_directory(self) -> None:
        """Empty and remove C{a/c} when it is there, else make it again."""
        if "a/c" not in self.picture:

            def make() -> None:
                self.path("a/c").mkdir()
                self.picture["a/c"] = "dir"

            self.attempt(("a/c",), make)
            return
        for rel in [rel for rel in self.files() if rel.startswith("a/c/")]:
            self.unlink(rel)

        def remove() -> None:
            self.path("a/c").rmdir()
            del self.picture["a/c"]

        if not any(rel.startswith("a/c/") for rel in self.picture):
            self.attempt(("a/c",), remove)


def main() -> None:
    root, stop, seed, result = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    workload = Workload(root, seed)
    for rel in DIRECTORIES:
        workload.path(rel).mkdir(exist_ok=True)
        if rel:
            workload.picture[rel] = "dir"
    started = time.monotonic()
    while not stop.exists() and time.monotonic() - started < 600:
        workload.step()
    Path(result).write_text(
        json.dumps(
            {
                "picture": workload.picture,
                "operations": workload.operations,
                "failures": workload.failures,
            }
        )
    )


if __name__ == "__main__":
    main()
