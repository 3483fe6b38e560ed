"""URLs in logs and error messages lose their credentials (a NATS password is a secret)."""

import pytest
from dynamo_worker.runtime.settings import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://user:s3cret@nats:4222", "nats://user:***@nats:4222"),
        ("nats://tok3n@nats:4222", "nats://***@nats:4222"),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("tls://u:p@h:1/path@x", "tls://u:***@h:1/path@x"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url(url, shown):
    assert redact_url(url) == shown
