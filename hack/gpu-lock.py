#!/usr/bin/env python3
"""The GPU pins of images/gpu-lock.txt, as the CUDA image and the GPU proofs' install read them.

    python3 hack/gpu-lock.py image                the requirements the image asks for
    python3 hack/gpu-lock.py device [NAME ...]    the requirements the proofs install (only NAMEs)
    python3 hack/gpu-lock.py device --except NAME ...
    python3 hack/gpu-lock.py constraints          every pin but the tools', without extras: the image's
                                                  pip -c file
    python3 hack/gpu-lock.py version NAME         one pin's version

One requirement a line; standard library only (it runs in the image build and on the GPU machine).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

LOCK = Path(__file__).resolve().parent.parent / "images" / "gpu-lock.txt"
USERS = ("image", "device", "tool")
_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<extras>\[[A-Za-z0-9,._-]+\])?==(?P<version>[^\s;]+)$"
)


@dataclass(frozen=True)
class Pin:
    name: str
    extras: str
    version: str
    users: frozenset[str]

    @property
    def key(self) -> str:
        """The name as PyPI compares names (PEP 503)."""
        return re.sub(r"[-_.]+", "-", self.name).lower()

    def requirement(self, *, extras: bool = True) -> str:
        return f"{self.name}{self.extras if extras else ''}=={self.version}"


def read(path: Path = LOCK) -> list[Pin]:
    """Every pin of the lock; a line that is not an exact pin followed by who installs it is an error."""
    pins = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text, _, comment = line.partition("#")
        if not text.strip():
            continue
        match = _PIN.match(text.strip())
        users = frozenset(comment.split(":")[0].split())
        if match is None or not users or not users <= set(USERS):
            raise SystemExit(
                f"{path}:{number}: {line.strip()!r} is not NAME==VERSION followed by # and who installs "
                f"it (image, device, device tool); fix the line"
            )
        pins.append(Pin(match["name"], match["extras"] or "", match["version"], users))
    return pins


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("image", "device", "constraints", "version"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    pins = read()
    what, names = argv[0], [_key(n) for n in argv[1:] if n != "--except"]
    known = {p.key for p in pins}
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"gpu-lock: {', '.join(unknown)} not pinned in {LOCK}", file=sys.stderr)
        return 2
    print(_answer(what, pins, names, excluding="--except" in argv))
    return 0


def _answer(what: str, pins: list[Pin], names: list[str], *, excluding: bool) -> str:
    """What ``main`` prints for ``what``: one pin's version, the constraints, or the requirements."""
    if what == "version":
        return next(p.version for p in pins if p.key == names[0])
    if what == "constraints":
        return "\n".join(p.requirement(extras=False) for p in pins if "tool" not in p.users)
    chosen = [p for p in pins if what in p.users]
    if names:
        chosen = [p for p in chosen if (p.key in names) != excluding]
    return "\n".join(p.requirement() for p in chosen)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
