"""Read a container's command line the way a manifest writes it, and edit SGLang flags in it. Pure.

Reading one flag's value is ``dynamo_operator.api.sglang_args.flag_value`` (the operator's reading).

Manifests written for Dynamo spell a worker's command in three ways, all understood here:

- command and args together: ``command: [python3, -m, dynamo.sglang]``, ``args: [--model-path, m]``;
- split anywhere: ``command: [python3]``, ``args: [-m, dynamo.sglang, --model-path, m]``;
- a shell string: ``command: [sh, -c]``, ``args: ["python3 -m dynamo.sglang --model-path m"]``
  (also ``cd /x && python3 -m ...``: the arguments end at the first shell operator).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ModuleCommand",
    "drop_flag",
    "parse_module_command",
    "set_flag",
]

_SHELLS = frozenset({"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/sh", "/usr/bin/bash"})
_SHELL_OPERATORS = frozenset({"&&", "||", ";", "|", "&"})


@dataclass(frozen=True)
class ModuleCommand:
    """``python -m MODULE ARGS...`` found in a container command."""

    module: str
    args: tuple[str, ...]


def _words(command: Sequence[str], args: Sequence[str]) -> list[str]:
    words = [*command, *args]
    if len(words) >= 3 and words[0] in _SHELLS and words[1] in ("-c", "-ec", "-ce", "-xc"):
        lexer = shlex.shlex(words[2], posix=True, punctuation_chars=True)
        lexer.whitespace_split = True  # words split at blanks; operators (&&, ;, |) are tokens of their own
        return list(lexer)
    return words


def parse_module_command(command: Sequence[str], args: Sequence[str]) -> ModuleCommand | None:
    """The Python module a container runs and its arguments, or None when it runs no ``-m`` module."""
    words = _words(command, args)
    for i, word in enumerate(words[:-1]):
        if word == "-m" and i > 0 and "python" in words[i - 1].rsplit("/", 1)[-1]:
            rest: list[str] = []
            for w in words[i + 2 :]:
                if w in _SHELL_OPERATORS:
                    break
                rest.append(w)
            return ModuleCommand(module=words[i + 1], args=tuple(rest))
    return None


def set_flag(args: Sequence[str], name: str, value: str, *aliases: str) -> tuple[str, ...]:
    """``args`` with every occurrence of ``name`` (or an alias) removed and ``name value`` appended."""
    return (*drop_flag(args, name, *aliases), name, value)


def drop_flag(args: Sequence[str], name: str, *aliases: str) -> tuple[str, ...]:
    """``args`` without any occurrence of ``name`` (or an alias) and its value."""
    names = (name, *aliases)
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in names:
            skip = True
            continue
        if any(a.startswith(n + "=") for n in names):
            continue
        out.append(a)
    return tuple(out)
