"""Helpers for the chart tests: run helm from the version-keyed binary cache and read its output."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.support.cluster import REPO

CHART = REPO / "charts" / "dynamo-operator"
KUBE_VERSION = "1.36.0"


def helm(bins: Path, *args: str, env: dict[str, str] | None = None, check: bool = True, timeout: float = 180):
    """Run ``helm``; returns the CompletedProcess (stdout/stderr as text)."""
    result = subprocess.run(
        [str(bins / "helm"), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def template(bins: Path, *values: str, namespace: str = "dynamo", release: str = "t") -> list[dict]:
    """``helm template`` of the chart with ``values`` (``key=value``), parsed into manifests."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for value in values:
        args += ["--set", value]
    out = helm(bins, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def template_error(bins: Path, *values: str) -> str:
    """The error ``helm template`` reports for ``values``; fails the test when it renders."""
    args = ["template", "t", str(CHART), "--kube-version", KUBE_VERSION]
    for value in values:
        args += ["--set", value]
    result = helm(bins, *args, check=False)
    assert result.returncode != 0, f"helm template accepted {values}"
    return result.stderr


def find(objs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
