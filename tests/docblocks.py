"""The code blocks of a Markdown page, in order: what the docs tests execute so the docs cannot rot."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["DocBlock", "doc_blocks", "tutorial_script", "write_titled_blocks"]

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


def tutorial_script(blocks: list[DocBlock], *, files_under: str) -> str:
    """One bash script that does what a reader of the page does, in the page's order: each `bash` block runs, and
    each block naming a file under `files_under` writes that file at its place in the page, so a later block with
    the same title is an edit of the file the earlier steps ran (quoted heredocs: the text is written as shown)."""
    parts = []
    for block in blocks:
        if block.lang == "bash":
            parts.append(block.body)
        elif block.title and block.title.startswith(files_under):
            assert "\n__DOC_BLOCK__\n" not in "\n" + block.body, block.title
            parts.append(f"mkdir -p '{PurePosixPath(block.title).parent}'\n"
                         f"cat > '{block.title}' <<'__DOC_BLOCK__'\n{block.body}__DOC_BLOCK__\n")
    return "\n".join(parts)
