"""dynamo_api.annotations: boolean annotation values are read leniently and refused otherwise."""

from __future__ import annotations

import pytest
from dynamo_api.annotations import parse_bool


def test_parse_bool():
    assert parse_bool(None) is None
    assert parse_bool("True") is True and parse_bool("false") is False
    assert parse_bool(" yes ") is True and parse_bool("0") is False
    with pytest.raises(ValueError):
        parse_bool("sometimes")
