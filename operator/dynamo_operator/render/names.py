"""Deterministic Kubernetes names for the children of a graph, within Kubernetes length limits.

A name that would be too long keeps a readable prefix and ends in 8 hex digits of the SHA-256 of the
full name, so two long names never collide by truncation and the same input gives the same name.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "MAX_LABEL_VALUE",
    "MAX_WORKLOAD_NAME",
    "child_name",
    "fit",
    "frontend_pods_service",
    "group_name",
    "label_value",
    "service_dns_name",
]

MAX_LABEL_VALUE = 63
# StatefulSets and LeaderWorkerSets label their pods "<name>-<10-char revision hash>" (a label value,
# at most 63 characters), so every workload name is kept to 52 characters.
MAX_WORKLOAD_NAME = 52
_HASH_LEN = 8


def fit(name: str, limit: int) -> str:
    """``name`` if it fits in ``limit`` characters, else a prefix of it plus '-' and a hash of it."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_HASH_LEN]
    return f"{name[: limit - _HASH_LEN - 1].rstrip('-')}-{digest}"


def label_value(value: str) -> str:
    """A label value for ``value`` (graph names may be longer than a label value allows)."""
    return fit(value, MAX_LABEL_VALUE)


def child_name(graph: str, service: str) -> str:
    """The Deployment (and Service) name of ``service`` in ``graph``: ``<graph>-<service lowercased>``."""
    return fit(f"{graph}-{service.lower()}", MAX_WORKLOAD_NAME)


def frontend_pods_service(graph: str, service: str) -> str:
    """The headless Service naming every ready pod of frontend ``service`` (what an endpoint picker
    resolves): ``<graph>-<service lowercased>-pods``, a DNS label."""
    return fit(f"{graph}-{service.lower()}-pods", MAX_LABEL_VALUE)


def group_name(graph: str, service: str, index: int, reserve: int = 0) -> str:
    """The name of multinode group ``index`` of ``service``, leaving ``reserve`` characters for suffixes."""
    suffix = f"-{index}"
    return fit(f"{graph}-{service.lower()}", MAX_WORKLOAD_NAME - reserve - len(suffix)) + suffix


def service_dns_name(pod: str, subdomain: str, namespace: str) -> str:
    """The stable DNS name of a pod behind a headless Service (resolvable with any cluster domain)."""
    return f"{pod}.{subdomain}.{namespace}.svc"
