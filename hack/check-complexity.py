"""Fail when a function's cyclomatic complexity is above the bound (radon's count).

    python hack/check-complexity.py            # api/, operator/, worker/, hack/; bound 20
    python hack/check-complexity.py --max 15 worker/dynamo_worker/frontend

A function above the bound is split into steps a reader can follow (named helpers, a table instead of
an if-chain), not into arbitrary chunks; issue 29 brought every one to 20 or below. Tests and
benchmarks are not checked; module size has its own gate (``hack/check-size.py``). Needs radon
(``pip install radon``), a measuring tool only; nothing imports it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MAX_COMPLEXITY = 20
CHECKED = ("api", "operator", "worker", "hack")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=CHECKED, help="folders or files (default: %(default)s)")
    parser.add_argument("--max", type=int, default=MAX_COMPLEXITY, help="the bound (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        from radon.complexity import cc_visit
    except ImportError:
        print("error: radon is not installed; pip install radon", file=sys.stderr)
        return 2
    files = sorted(
        f
        for p in map(Path, args.paths)
        for f in ([p] if p.is_file() else p.rglob("*.py"))
        if ".venv" not in f.parts
    )
    above = []
    for path in files:
        for block in cc_visit(path.read_text()):
            if block.complexity > args.max:
                name = f"{block.classname}.{block.name}" if getattr(block, "classname", None) else block.name
                above.append(f"{path}:{block.lineno} {name} {block.complexity}")
    for line in above:
        print(line)
    if above:
        print(
            f"{len(above)} function(s) above cyclomatic complexity {args.max}: split each into named steps",
            file=sys.stderr,
        )
        return 1
    print(f"OK: {len(files)} files, no function above cyclomatic complexity {args.max}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
