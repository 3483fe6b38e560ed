"""Fail listing every import cycle between the modules of dynamo_api, dynamo_clients, dynamo_operator and
dynamo_worker.

    python hack/check-import-cycles.py

The import-linter contract "no import cycle anywhere" (acyclic_siblings) checks the children of every
package against each other; a package's own ``__init__`` is not one of its children, so a cycle through
it (``pkg/__init__.py`` imports ``pkg.a``, which imports ``pkg``) passes there. This check builds the
module graph with grimp (import-linter's graph library), ``TYPE_CHECKING`` imports included, and fails on
any strongly connected group of two or more modules, printing one cycle through each.
"""

from __future__ import annotations

import sys

PACKAGES = ("dynamo_api", "dynamo_clients", "dynamo_operator", "dynamo_worker")


def cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(imports.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def one_cycle(imports: dict[str, set[str]], group: list[str]) -> list[str]:
    """A shortest import chain from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(imports[node] & members):
                if child == start:
                    chain = [node]
                    while chain[-1] != start:
                        chain.append(came_from[chain[-1]])
                    return [start, *reversed(chain[:-1]), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return group


def main() -> int:
    import grimp

    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, exclude_type_checking_imports=False)
    imports = {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}
    found = cycles(imports)
    for group in found:
        print(f"import cycle among {len(group)} modules: {' -> '.join(one_cycle(imports, group))}")
    if found:
        print(f"{len(found)} import cycle(s); break each by moving what both sides need into a lower module")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
