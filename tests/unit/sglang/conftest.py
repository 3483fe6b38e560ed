"""The source of the oldest and the newest SGLang of the window, for the tests that check our code
against SGLang's own definitions. The wheels are downloaded once (``pip download --no-deps``) into the
project cache folder, the same files ``hack/sglang-compat.sh`` uses."""

from __future__ import annotations

from pathlib import Path

import pytest
from dynamo_worker.sglang import compat, uses

OLDEST, NEWEST = uses.SGLANG_WINDOW


@pytest.fixture(scope="session")
def sglang_sources() -> dict[str, Path]:
    """``{version: folder containing sglang/}`` for both ends of the window."""
    return {version: compat.fetch_sglang_source(version) for version in uses.SGLANG_WINDOW}


@pytest.fixture(scope="session")
def oldest_src(sglang_sources) -> Path:
    return sglang_sources[OLDEST]


@pytest.fixture(scope="session")
def newest_src(sglang_sources) -> Path:
    return sglang_sources[NEWEST]
