"""Fail when a module of api/, operator/, worker/ or hack/ is longer than the bound (600 lines).

    python hack/check-size.py                  # every module; bound 600
    python hack/check-size.py worker/dynamo_worker/mocker

A module that grows a second concern is split into modules named by what a reader looks for (STYLE.md:
one concept per module). ``ALLOWED`` holds the modules that stay longer, each with its reason; it is
not a waiting room. Tests and benchmarks are not checked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MAX_LINES = 600
CHECKED = ("api", "operator", "worker", "hack")
ALLOWED = {
    "worker/dynamo_worker/frontend/protocol.py": "the OpenAI wire models, one concept (SGLang's protocol.py)",
    "api/dynamo_api/conversion.py": "the v1alpha1 <-> v1beta1 conversion, one mapping read both ways",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=CHECKED, help="folders or files (default: %(default)s)")
    parser.add_argument("--max", type=int, default=MAX_LINES, help="the bound (default: %(default)s)")
    args = parser.parse_args(argv)
    files = sorted(
        f
        for p in map(Path, args.paths)
        for f in ([p] if p.is_file() else p.rglob("*.py"))
        if ".venv" not in f.parts
    )
    exempt = ALLOWED.keys()
    above = [
        (f, n)
        for f in files
        if (n := len(f.read_text().splitlines())) > args.max and f.as_posix() not in exempt
    ]
    for path, lines in above:
        print(f"{path}: {lines} lines")
    if above:
        print(f"{len(above)} module(s) above {args.max} lines: split each by concept", file=sys.stderr)
        return 1
    print(f"OK: {len(files)} files, none above {args.max} lines but {len(exempt)} allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
