"""The operator's credentials are loaded by kubernetes_asyncio's kubeconfig loader, as kubectl loads
them, and handed to kopf's login as they are: the server, the CA and client certificate files, and the
Authorization header's scheme and token (a bearer token, or Basic for a user with a password)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml
from dynamo_operator.reconcile.kube import load_credentials


def kubeconfig(path: Path, user: dict) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {"server": "https://127.0.0.1:6443/", "certificate-authority": "ca.crt"},
                    }
                ],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    (path.parent / "ca.crt").write_text("not read until a connection is made")
    return path


async def test_a_token_user_logs_in_with_bearer(tmp_path):
    creds = await load_credentials(kubeconfig(tmp_path / "config", {"token": "abc.def"}), in_cluster=False)
    assert creds.server == "https://127.0.0.1:6443"
    assert creds.ca_path == str(tmp_path / "ca.crt")  # relative to the kubeconfig, as kubectl reads it
    assert creds.cert_path is None and creds.key_path is None and creds.verify_ssl
    assert await creds.authorization() == ("Bearer", "abc.def")


async def test_a_password_user_logs_in_with_basic(tmp_path):
    path = kubeconfig(tmp_path / "config", {"username": "admin", "password": "s3cret"})
    creds = await load_credentials(path, in_cluster=False)
    assert await creds.authorization() == ("Basic", base64.b64encode(b"admin:s3cret").decode())


async def test_a_client_certificate_user_sends_no_authorization_header(tmp_path):
    user = {"client-certificate": "admin.crt", "client-key": "admin.key"}
    for name in ("admin.crt", "admin.key"):  # the loader checks that they exist
        (tmp_path / name).write_text("read when a connection is made")
    creds = await load_credentials(kubeconfig(tmp_path / "config", user), in_cluster=False)
    assert (creds.cert_path, creds.key_path) == (str(tmp_path / "admin.crt"), str(tmp_path / "admin.key"))
    assert await creds.authorization() == (None, None)
