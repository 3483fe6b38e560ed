"""API key settings and the header check: --api-key, DYN_API_KEY and --api-key-file (several keys)
give the accepted keys; a blank key or an unreadable file is refused with a message that quotes no
key; ``--help`` shows no key; the Bearer header is parsed in any case and compared with every key.
(The keys served over HTTP with the openai client: tests/integration/frontend/test_frontend_api_key.py.)"""

from __future__ import annotations

import pytest
from dynamo_worker.frontend.http.auth import accepted, presented_key
from dynamo_worker.frontend.settings import FrontendSettings
from dynamo_worker.runtime.settings import SettingsError

KEY = "sk-flag-4c1d2e"


def test_no_key_by_default():
    assert FrontendSettings.parse([], env={}).api_keys() == ()


def test_flag_env_and_file_keys(tmp_path):
    assert FrontendSettings.parse(["--api-key", KEY], env={}).api_keys() == (KEY.encode(),)
    assert FrontendSettings.parse([], env={"DYN_API_KEY": KEY}).api_keys() == (KEY.encode(),)
    keys = tmp_path / "keys"
    keys.write_text("# rotated 2026-11\nsk-old\n\n  sk-new  \n")
    s = FrontendSettings.parse(["--api-key", KEY], env={"DYN_API_KEY_FILE": str(keys)})
    assert s.api_keys() == (KEY.encode(), b"sk-old", b"sk-new")


def test_bad_keys_are_refused_without_quoting_a_key(tmp_path):
    with pytest.raises(SettingsError, match="blank") as e:
        FrontendSettings.parse(["--api-key", "  "], env={})
    empty = tmp_path / "empty"
    empty.write_text("# no key yet\n")
    with pytest.raises(SettingsError, match="holds no key"):
        FrontendSettings.parse(["--api-key-file", str(empty)], env={})
    with pytest.raises(SettingsError, match="cannot read it") as e:
        FrontendSettings.parse(["--api-key", KEY, "--api-key-file", str(tmp_path / "absent")], env={})
    assert KEY not in str(e.value)


def test_key_is_not_in_help_or_repr():
    text = FrontendSettings.parser().format_help()
    assert "--api-key KEY" in text and "DYN_API_KEY" in text and "--api-key-file FILE" in text
    s = FrontendSettings.parse(["--api-key", KEY], env={})
    assert KEY not in repr(s) and KEY not in str(s.model_dump())


def test_bearer_header():
    assert presented_key(f"Bearer {KEY}") == KEY.encode()
    assert presented_key(f"bearer  {KEY} ") == KEY.encode()
    for header in (None, "", "Bearer", "Bearer  ", f"Basic {KEY}", KEY):
        assert presented_key(header) is None, header
    assert accepted(b"b", [b"a", b"b"]) and not accepted(b"c", [b"a", b"b"]) and not accepted(b"a", [])
