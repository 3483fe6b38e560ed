"""Merge a user's ``extraPodSpec`` (a PodSpec plus ``mainContainer``) over the generated pod spec.

Rules, the user winning wherever both set something:
- mappings merge key by key, recursively (``nodeSelector``, ``securityContext``, ``resources``);
- lists of named things merge by name, the user's entry merged over ours (``containers``,
  ``initContainers``, ``volumes``, ``env``, ``ports``); ``volumeMounts`` merge by ``mountPath``;
  ``capabilities.add`` is the union;
- probes and any other value (``command``, ``args``, ``image``, ``tolerations``, ...) are replaced
  by the user's.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["merge"]

_KEYED_LISTS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "ports": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
}
_UNION_LISTS = {"add", "drop"}
# Replaced whole: mixing two probes could leave a probe with two handlers.
_REPLACED = {"livenessProbe", "readinessProbe", "startupProbe"}


def _merge_keyed(ours: list[Any], theirs: list[Any], key: str) -> list[Any]:
    out = [copy.deepcopy(item) for item in ours]
    index = {item.get(key): i for i, item in enumerate(out) if isinstance(item, dict)}
    for item in theirs:
        if isinstance(item, dict) and item.get(key) in index:
            i = index[item[key]]
            out[i] = merge(out[i], item)
        else:
            out.append(copy.deepcopy(item))
    return out


def merge(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """``ours`` with ``theirs`` merged over it (new dicts; inputs are not changed)."""
    out = copy.deepcopy(ours)
    for key, value in theirs.items():
        mine = out.get(key)
        if key in _REPLACED:
            out[key] = copy.deepcopy(value)
        elif isinstance(mine, dict) and isinstance(value, dict):
            out[key] = merge(mine, value)
        elif isinstance(mine, list) and isinstance(value, list) and key in _KEYED_LISTS:
            out[key] = _merge_keyed(mine, value, _KEYED_LISTS[key])
        elif isinstance(mine, list) and isinstance(value, list) and key in _UNION_LISTS:
            out[key] = mine + [v for v in value if v not in mine]
        else:
            out[key] = copy.deepcopy(value)
    return out
