"""The code blocks of a Markdown page, in order: what the docs tests execute so the docs cannot rot."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DocBlock", "doc_blocks", "write_titled_blocks"]

_FENCE = re.compile(r'^```(?P<lang>[a-z]+)(?: title="(?P<title>[^"]+)")?\n(?P<body>.*?)^```$', re.M | re.S)


@dataclass(frozen=True)
class DocBlock:
    lang: str
    title: str | None
    body: str


def doc_blocks(page: Path) -> list[DocBlock]:
    return [DocBlock(m["lang"], m["title"], m["body"]) for m in _FENCE.finditer(page.read_text())]


def write_titled_blocks(blocks: list[DocBlock], root: Path) -> list[Path]:
    """Write every block that names a file (`title="path"`) under `root`; return the paths written."""
    written = []
    for block in blocks:
        if block.title:
            path = root / block.title
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body)
            written.append(path)
    return written
