"""Where a benchmark writes its numbers: a marked section of a docs page.

Each benchmark's ``--write-docs`` replaces the text between ``<!-- NAME:start -->``
and ``<!-- NAME:end -->`` in its page (docs/benchmarks.md or docs/results.md) and
leaves the rest of the page alone; a page without the markers gets the section
appended (after ``heading``, when given).
"""

from __future__ import annotations

from pathlib import Path


def write_section(doc: Path, name: str, body: str, *, heading: str = "", title: str = "# Benchmarks") -> None:
    """Put ``body`` between ``name``'s markers in ``doc`` (a new page starts with ``title``)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.strip(chr(10))}\n{end}"
    text = doc.read_text() if doc.exists() else title + "\n"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + (f"{heading}\n\n" if heading else "") + block + "\n"
    doc.write_text(text)
