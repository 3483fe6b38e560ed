"""Print what changed in the ``--help`` of every entry point between a git ref and the working tree.

    python hack/help-diff.py 765df6e          # flags added, removed or reworded since that commit
    python hack/help-diff.py main --full      # and the unified diff of each changed text

Entry points: the modules of ``[project.scripts]`` and every ``__main__.py`` under api/, operator/ and
worker/. The ref is checked out in a temporary detached worktree and both sides run with this
checkout's ``.venv`` python (``PYTHONPATH`` pointing into each tree, ``COLUMNS=100``), so only the code
differs. Each option is compared as one line of text (wrapping ignored). A review aid for the closing
note of a change ("--help unchanged, or changed where said why"), not a lint: it exits 0 either way.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "operator", "worker")
OPTION = re.compile(r"^  (-\S.*?)(?:\s{2,}(.*))?$")


def entry_points(tree: Path) -> list[str]:
    """``python -m`` module names: [project.scripts] first, then every package with a ``__main__``."""
    scripts = tomllib.loads((tree / "pyproject.toml").read_text()).get("project", {}).get("scripts", {})
    found = [target.split(":")[0].removesuffix(".__main__") for target in scripts.values()]
    for package in PACKAGES:
        for main in sorted((tree / package).rglob("__main__.py")):
            module = ".".join(main.parent.relative_to(tree / package).parts)
            if module not in found:
                found.append(module)
    return found


def help_text(tree: Path, module: str) -> str:
    env = dict(os.environ, COLUMNS="100", PYTHONPATH=os.pathsep.join(str(tree / p) for p in PACKAGES))
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=tempfile.gettempdir(),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-500:]}"


def options(text: str) -> dict[str, str]:
    """Each option's line (its flags, metavar and help, unwrapped), and the rest of the text as one entry."""
    found: dict[str, str] = {}
    rest: list[str] = []
    current = None
    for line in text.split("\n\n", 1)[-1].splitlines():  # the usage block is left out
        match = OPTION.match(line)
        if match:
            current = match.group(1).split(" ")[0].rstrip(",")
            found[current] = " ".join(filter(None, (match.group(1), match.group(2))))
        elif line.startswith("    ") and current:
            found[current] += " " + line.strip()
        else:
            current = None
            rest.append(line.strip())
    found["(description, sections, epilog)"] = " ".join(filter(None, rest))
    return {key: re.sub(r"\s+", " ", value).strip() for key, value in found.items()}


def compare(module: str, before: str, after: str, full: bool) -> None:
    old, new = options(before), options(after)
    lines = []
    for key in sorted(old.keys() | new.keys()):
        if key not in old:
            lines.append(f"  added    {key}: {new[key]}")
        elif key not in new:
            lines.append(f"  REMOVED  {key}: {old[key]}")
        elif old[key] != new[key]:
            lines.append(f"  changed  {key}:\n      was: {old[key]}\n      now: {new[key]}")
    print(f"== {module}: {'unchanged' if not lines else f'{len(lines)} change(s)'}")
    if lines:
        print("\n".join(lines))
    if full and lines:
        diff = difflib.unified_diff(before.splitlines(True), after.splitlines(True), "before", "after")
        print("".join(diff))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ref", help="the git ref to compare the working tree with")
    parser.add_argument("--full", action="store_true", help="also print each changed text's unified diff")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="help-diff-") as tmp:
        base = Path(tmp) / "tree"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "-q", "--detach", str(base), args.ref], check=True)
        try:
            modules = entry_points(ROOT)
            modules += [m for m in entry_points(base) if m not in modules]
            for module in modules:
                compare(module, help_text(base, module), help_text(ROOT, module), args.full)
        finally:
            subprocess.run([*git, "remove", "--force", str(base)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
