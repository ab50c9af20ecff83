"""
The operations table of ``docs/specifications/wire.md``, generated from the
declarations (L{svc.wire.commands}), so the document cannot drift from the
code: C{svc/wire/test/test_document.py} checks the block between the markers
equals L{commands_table}. Regenerate it with::

    .venv/bin/python -m svc.wire.document docs/specifications/wire.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from svc.wire.commands import COMMANDS, PUSHES, Raw
from svc.wire.schema import Flat, message_fields, wire_keys

BEGIN = "<!-- generated: commands -->"
END = "<!-- end generated: commands -->"


def _keys(message: type) -> str:
    parts = []
    for name, spec in message_fields(message):
        if isinstance(spec.kind, Flat):
            parts.append("the attribute keys")
            continue
        parts.append(f"`{name}`" if spec.required else f"`{name}`?")
    return ", ".join(parts) if parts else "none"


def _raw(raw: Raw) -> str:
    return "" if raw is Raw.NONE else f" + raw ({raw.value})"


def commands_table() -> str:
    """The markdown table of every operation and push."""
    lines = [
        "| op | request keys (`?` optional) | answer keys | resend | payload ≤ | errnos besides "
        "EPROTO, EIO, EAGAIN, EBADF, ETIMEDOUT |",
        "|---|---|---|---|---|---|",
    ]
    generic = {"EPROTO", "EIO", "EAGAIN", "EBADF", "ETIMEDOUT"}
    for op, command in COMMANDS.items():
        errnos = sorted(e.name for e in command.errnos if e.name not in generic)
        lines.append(
            f"| `{op.value}` | {_keys(command.request)}{_raw(command.raw_request)} "
            f"| {_keys(command.reply)}{_raw(command.raw_reply)} "
            f"| {'yes' if command.resendable else 'no'} "
            f"| {command.limits.payload} "
            f"| {', '.join(errnos) or '—'} |"
        )
    for op, push in PUSHES.items():
        keys = ", ".join(f"`{key}`" for key in wire_keys(push.message))
        lines.append(f"| `{op.value}` (PUSH) | — | {keys} | — | — | — |")
    return "\n".join(lines)


def rewrite(text: str) -> str:
    """C{text} with the generated block replaced by the current table."""
    start = text.index(BEGIN) + len(BEGIN)
    end = text.index(END)
    return text[:start] + "\n" + commands_table() + "\n" + text[end:]


def main(argv: list[str]) -> int:
    """Rewrite the generated block of the document named in C{argv}."""
    if len(argv) != 2:
        print(f"usage: {argv[0]} docs/specifications/wire.md", file=sys.stderr)
        return 64
    path = Path(argv[1])
    path.write_text(rewrite(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
