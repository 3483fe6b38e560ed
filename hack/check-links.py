"""Every relative link in the project's Markdown resolves: the file exists and, with an ``#anchor``, the
heading does (GitHub's slugs). ``make lint-code`` runs it; external links (http, https, mailto) are not
fetched. Usage: python hack/check-links.py [FILE.md ...] (default: README.md, docs/, and every README)."""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
SKIP_DIRS = {".venv", "node_modules", ".git", ".gpuw", ".cluster"}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_fence = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        if in_fence or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    in_fence = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # code spans are not links
        for m in LINK.finditer(line):
            found.append((number, m.group(1) or m.group(2)))
    return found


def problems(path: Path) -> list[str]:
    out = []
    for number, target in links(path):
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            out.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{where}: no heading with the anchor #{anchor} in {dest.relative_to(ROOT)}")
    return out


def default_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for readme in sorted(ROOT.rglob("README.md")):
        if not SKIP_DIRS.intersection(readme.relative_to(ROOT).parts) and readme not in files:
            files.append(readme)
    return files


def main(argv: list[str]) -> int:
    files = [Path(a).resolve() for a in argv] or default_files()
    found = [p for f in files for p in problems(f)]
    for p in found:
        print(p)
    if found:
        print(f"{len(found)} broken link(s): fix the path or the anchor (GitHub's heading slug)")
        return 1
    print(f"links: {sum(len(links(f)) for f in files)} links in {len(files)} files resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
