"""Rewrite one generated section of a Markdown file, between `<!-- begin NAME -->` and `<!-- end NAME -->`."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, name: str, body: str) -> None:
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + f"\n\n## {name}\n\n{block}\n"
    path.write_text(text)
