"""The source of the oldest and the newest SGLang of the window (tests/support/sglang_source.py)."""

from tests.support.sglang_source import newest_src, oldest_src, sglang_sources  # noqa: F401 - fixtures
