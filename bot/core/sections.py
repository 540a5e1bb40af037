"""Pure: the probe's output grammar — sections cut at marker lines a log cannot forge (a fresh nonce each
probe), each part's exit status and stderr beside it."""

from __future__ import annotations

import re
from dataclasses import dataclass

LINE_CAP = 2000  # characters kept of one found line: bars can make one line of 100 MB
_NAME = re.compile(r"[a-z][a-z.]*\Z")


def marker(nonce: str) -> bytes:
    return f"\n@@RB:{nonce}@@ ".encode()


@dataclass(frozen=True)
class Sections:
    """A probe's output split by section name; missing sections are simply absent."""

    parts: dict[str, bytes]

    def get(self, name: str) -> bytes | None:
        return self.parts.get(name)

    def text(self, name: str, limit: int = 1 << 20) -> str:
        raw = self.parts.get(name) or b""
        return raw[:limit].decode("utf-8", "replace")

    def rc(self, name: str) -> int | None:
        raw = self.parts.get(f"{name}.rc")
        try:
            return int(raw.strip()) if raw is not None else None
        except ValueError:
            return None

    @property
    def complete(self) -> bool:
        return "end" in self.parts


def split_sections(stdout: bytes, nonce: str) -> Sections:
    """Cut the probe's stdout at its marker lines. Never raises, whatever the bytes."""
    parts: dict[str, bytes] = {}
    chunks = (b"\n" + stdout).split(marker(nonce))
    for chunk in chunks[1:]:
        name, _, body = chunk.partition(b"\n")
        key = name.decode("ascii", "replace").strip()
        if _NAME.match(key) and key not in parts:
            parts[key] = body
    return Sections(parts)
