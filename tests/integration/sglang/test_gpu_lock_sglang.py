"""The GPU lock (images/gpu-lock.txt) agrees with the SGLang release it pins: every package that release
requires at one exact version (torch, sglang-kernel, flashinfer, xgrammar, ...) is pinned there at that
version, so the image's resolution under the lock's constraints succeeds and the proofs install the
kernels that SGLang was built against. Reads the release's wheel metadata (downloaded once)."""

from __future__ import annotations

import re
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from dynamo_worker.runtime.settings import cache_root
from dynamo_worker.sglang import compat

from tests.support.gpu_lock import LOCK, reader
from tests.support.purity import fetching_test_data

pytestmark = pytest.mark.integration
PINS = reader().read(LOCK)


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel(version: str) -> Path:
    wheels = sorted((cache_root() / "dl").glob(f"sglang-{version}-*.whl"))
    if not wheels:
        with fetching_test_data():
            compat.fetch_sglang_source(version)  # downloads the wheel into the cache's dl/
        wheels = sorted((cache_root() / "dl").glob(f"sglang-{version}-*.whl"))
    return wheels[-1]


def _exact_requirements(wheel: Path) -> dict[str, str]:
    """The unconditional ``name==version`` requirements of a wheel (no extra, no environment marker)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(name).decode())
    out = {}
    for req in metadata.get_all("Requires-Dist") or []:
        match = re.fullmatch(r"([A-Za-z0-9._-]+)(\[[^\]]*\])?\s*==\s*([^\s;,]+)", req.strip())
        if match:
            out[_key(match[1])] = match[3]
    return out


def test_the_lock_pins_what_its_sglang_release_pins():
    sglang = next(p for p in PINS if p.key == "sglang")
    required = _exact_requirements(_wheel(sglang.version))
    assert {"torch", "sglang-kernel", "flashinfer-python", "xgrammar"} <= set(required)
    pinned = {p.key: p.version for p in PINS}
    differ = {name: (pinned[name], want) for name, want in required.items() if pinned.get(name, want) != want}
    assert differ == {}, f"images/gpu-lock.txt pins (lock, SGLang {sglang.version} requires): {differ}"
    engine = {"torch", "sglang-kernel", "flashinfer-python", "xgrammar"}
    assert engine <= set(pinned), "the engine packages SGLang pins are in the lock"
