"""Write one section of benchmarks/RESULTS.md between its markers, leaving the others as they are."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(name: str, title: str, text: str) -> None:
    """Replace the block between `<!-- name:begin -->` and `<!-- name:end -->` (appended under `title` if absent)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    body = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in body:
        head, rest = body.split(begin, 1)
        body = head + block + rest.split(end, 1)[1]
    else:
        body = body.rstrip() + f"\n\n## {title}\n\n" + block + "\n"
    RESULTS.write_text(body)


def publish(name: str, title: str, text: str, write: bool) -> None:
    """Write the section with `--write`, else print it."""
    if write:
        write_section(name, title, text)
    else:
        print(text)
