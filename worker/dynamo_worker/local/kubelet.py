"""What a cluster gives a pod and one machine does not: the pods ``render()`` describes, as processes. Pure.

``render()`` decides every pod's command, args, environment and ports. dynamo-run runs them as they are,
like a small kubelet, and substitutes only this (the one place it is decided):

- controllers: a Deployment of ``replicas`` pods ``<name>-<i>``; a StatefulSet's pods ``<name>-<ordinal>``
  (from ``spec.ordinals.start``) with the controller's labels (``apps.kubernetes.io/pod-index``) and the
  DNS name ``<pod>.<serviceName>.<namespace>.svc`` its headless Service gives it;
- ``$(VAR)``: expanded as Kubernetes does, an env value from the entries before it, command and args
  from the container's whole env; ``$$`` is a literal ``$``; an unknown ``$(VAR)`` stays as written;
- downward API (``valueFrom.fieldRef``): ``metadata.name``, ``metadata.namespace``,
  ``metadata.labels['k']``, ``metadata.annotations['k']`` from the pod; ``status.podIP`` and
  ``status.hostIP`` are ``127.0.0.1``; any other ``valueFrom`` (secrets, config maps) is not read locally
  (``Localized.unread`` names it);
- addresses: ``0.0.0.0`` (a pod's own interfaces) and the DNS name of a pod of the graph (optionally
  ending in ``.cluster.local``) become ``127.0.0.1``;
- ports: each declared ``containerPort`` P of a pod has a local port L (``ports``: P -> L). In env values
  and in command and args, a reference to P becomes L: a value that is exactly P (an env value, or the
  argument after a ``--...port`` flag), ``--...port=P`` or ``--...port P`` inside a string (a shell
  script), and ``HOST:P``, where P is the port of the pod that HOST names, else of this pod. Any other
  number is left alone, so a port of another kind (``--kv-events-port``, a ``tcp://*:P`` endpoint) needs
  no code here: the renderer declares it as a containerPort and references it as above.

Nothing else is changed: no flag is added, removed or reordered here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LOOPBACK", "POD_INDEX_LABEL", "Localized", "Pod", "expand", "localize", "pods_of"]

LOOPBACK = "127.0.0.1"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"  # set by the StatefulSet controller on each pod
_POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_PORT_FLAG = re.compile(r"--[A-Za-z0-9-]*port")
_PORT_REF = re.compile(
    r"(?:(?P<flag>--[A-Za-z0-9-]*port(?:=|\s+))|(?P<host>[\w.-]*):)(?P<port>\d{1,5})(?!\d)"
)
_LABEL_FIELD = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


@dataclass(frozen=True)
class Pod:
    """One pod a workload object of ``render()`` asks for, named as its controller would name it."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    spec: Mapping[str, Any]  # the rendered pod spec, unchanged
    dns_name: str | None = None  # <pod>.<subdomain>.<namespace>.svc, for StatefulSet pods

    @property
    def main(self) -> Mapping[str, Any]:
        """The container that runs the service (``main``; the first one when none has that name)."""
        containers = self.spec["containers"]
        return next((c for c in containers if c.get("name") == "main"), containers[0])

    @property
    def declared_ports(self) -> dict[str, int]:
        """The main container's ports by name (a nameless port by its number)."""
        return {
            str(p.get("name") or p["containerPort"]): int(p["containerPort"])
            for p in self.main.get("ports", [])
        }


def pods_of(objects: Sequence[Mapping[str, Any]]) -> list[Pod]:
    """The pods the Deployments and StatefulSets among ``objects`` would create, in order."""
    pods: list[Pod] = []
    for obj in objects:
        kind, meta, spec = obj.get("kind"), obj["metadata"], obj.get("spec", {})
        if kind not in ("Deployment", "StatefulSet"):
            continue
        template = spec["template"]
        tmeta = template.get("metadata", {})
        names: list[tuple[str, int | None]]
        if kind == "Deployment":
            names = [(f"{meta['name']}-{i}", None) for i in range(spec.get("replicas", 1))]
        else:
            start = spec.get("ordinals", {}).get("start", 0)
            names = [(f"{meta['name']}-{o}", o) for o in range(start, start + spec.get("replicas", 1))]
        for name, ordinal in names:
            labels = dict(tmeta.get("labels", {}))
            dns = None
            if ordinal is not None:
                labels.update({POD_INDEX_LABEL: str(ordinal), _POD_NAME_LABEL: name})
                dns = f"{name}.{spec['serviceName']}.{meta['namespace']}.svc"
            pods.append(
                Pod(
                    name=name,
                    namespace=meta["namespace"],
                    labels=labels,
                    annotations=dict(tmeta.get("annotations", {})),
                    spec=template["spec"],
                    dns_name=dns,
                )
            )
    return pods


def expand(text: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` references in ``text`` expanded from ``env``, as Kubernetes does."""

    def one(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        return env.get(m[1], m[0])

    return _VAR.sub(one, text)


@dataclass(frozen=True)
class Localized:
    """A pod's main container as a local process: what to run and its environment (the pod's only)."""

    argv: tuple[str, ...]
    env: dict[str, str]
    unread: tuple[str, ...] = field(default=())  # env names whose valueFrom is not read locally


class _Addresses:
    """Rewrites addresses and port references in one pod's strings (see the module docstring)."""

    def __init__(self, own: Mapping[int, int], peers: Mapping[str, Mapping[int, int]]) -> None:
        self.own = own
        self.peers = peers
        names = sorted([*peers, "0.0.0.0"], key=len, reverse=True)
        self.hosts = re.compile(
            r"(?<![\w.-])(?:" + "|".join(re.escape(n) for n in names) + r")(?:\.cluster\.local)?(?![\w-])"
        )

    def _port(self, m: re.Match[str]) -> str:
        port = int(m["port"])
        host = m["host"]
        table = self.own
        if host is not None:
            table = self.peers.get(host.removesuffix(".cluster.local"), self.own)
        if port not in table:
            return m[0]
        return m[0][: m.start("port") - m.start()] + str(table[port])

    def text(self, value: str) -> str:
        return self.hosts.sub(LOOPBACK, _PORT_REF.sub(self._port, value))

    def value(self, value: str, *, is_port: bool) -> str:
        """``value`` rewritten; ``is_port``: it stands where a port goes (env value, port flag's value)."""
        if is_port and value.isdigit() and int(value) in self.own:
            return str(self.own[int(value)])
        return self.text(value)


def _field(path: str, pod: Pod) -> str | None:
    simple = {
        "metadata.name": pod.name,
        "metadata.namespace": pod.namespace,
        "status.podIP": LOOPBACK,
        "status.hostIP": LOOPBACK,
    }
    if path in simple:
        return simple[path]
    m = _LABEL_FIELD.fullmatch(path)
    if m:
        return (pod.labels if m[1] == "labels" else pod.annotations).get(m[2])
    return None


def localize(pod: Pod, ports: Mapping[int, int], peers: Mapping[str, Mapping[int, int]]) -> Localized:
    """The argv and environment of ``pod``'s main container on this machine.

    ``ports`` maps each declared containerPort of the pod to its local port; ``peers`` maps the DNS name
    of every pod of the graph to its own such map.
    """
    rewrite = _Addresses(ports, peers)
    container = pod.main
    env: dict[str, str] = {}
    unread: list[str] = []
    for item in container.get("env", []):
        source = item.get("valueFrom")
        if source is None:
            env[item["name"]] = expand(rewrite.value(item.get("value", ""), is_port=True), env)
            continue
        value = _field(source["fieldRef"]["fieldPath"], pod) if "fieldRef" in source else None
        if value is None:
            unread.append(item["name"])
        else:
            env[item["name"]] = value
    words = [*container.get("command", []), *container.get("args", [])]
    argv = []
    for i, word in enumerate(words):
        after_port_flag = i > 0 and _PORT_FLAG.fullmatch(words[i - 1]) is not None
        argv.append(expand(rewrite.value(word, is_port=after_port_flag), env))
    return Localized(argv=tuple(argv), env=env, unread=tuple(unread))
