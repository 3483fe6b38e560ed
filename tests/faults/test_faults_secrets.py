"""Secrets never appear in logs, status, Events or metric labels: runs that use them (an HF token in
a worker's environment, NATS credentials in the URL, the frontend's API key from its environment with
requests sending it, a wrong key and none, a Secret behind ``envFromSecret``, a literal env value, and
an invalid env entry whose value the operator must not quote), with a NATS restart to make the runtime
log its reconnects, then a grep of everything a user or another tenant can read (``--help`` with the
key set included)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time

import openai
import pytest
from dynamo_worker.runtime.nats_server import NatsServer

from tests.faults.frontend_proc import start_frontend
from tests.faults.test_faults_workers import MESSAGES, MODEL, until
from tests.integration.operator.conftest import Kubectl, OperatorProcess, example, wait_until
from tests.support.procs import die_with_parent

pytestmark = pytest.mark.integration


def token(kind: str) -> str:
    return f"{kind}_{secrets.token_hex(12)}"


def leaks(places: dict[str, str], values: list[str]) -> list[str]:
    return [
        f"{value[:6]}... in {where}" for where, text in places.items() for value in values if value in text
    ]


async def test_secrets_absent_from_worker_and_frontend_output(
    mockers, namespace, tmp_path, fault_row, monkeypatch
):
    row = fault_row(
        "secrets absent (data plane)",
        "HF token in a worker's env, NATS password in the URL, frontend API key (right, wrong, none), NATS "
        "restart; grep logs, /metrics, discovery, 401 bodies, --help",
        0,
    )
    row.unit = "leaks"
    hf_token, password, api_key, wrong_key = token("hf"), token("natspw"), token("sk"), token("sk")
    broker = NatsServer(
        store_dir=tmp_path / "nats",
        command_prefix=die_with_parent(),
        extra_args=("--user", "dynamo", "--pass", password),
    ).start()
    url = f"nats://dynamo:{password}@127.0.0.1:{broker.port}"
    monkeypatch.setenv("HF_TOKEN", hf_token)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", hf_token)
    fe = None
    try:
        m = mockers("null", "--nats-server", url)
        env = {**os.environ, "DYN_API_KEY": api_key, "DYN_LOG_LEVEL": "DEBUG"}
        fe = start_frontend(tmp_path / "frontend.log", namespace, url, env=env)
        await asyncio.to_thread(fe.wait_serving)
        refusals = await refused_bodies(fe.url, wrong_key)
        async with openai.AsyncOpenAI(
            base_url=fe.url + "/v1", api_key=api_key, max_retries=0, timeout=30
        ) as c:
            r = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
            assert r.choices[0].finish_reason == "length"
            broker.proc.kill()  # the runtime logs the disconnect and the reconnect
            broker.proc.wait(10)
            broker.start()
            await until(  # the worker writes its record again after the reconnect (or its next heartbeat)
                lambda: "Reconnected to NATS" in fe.log() and "Renewed registration" in m.log(),
                "reconnects and the worker's renewed record",
            )
            r = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
        records = await discovery_records(url)
        places = {
            "worker log": m.log(),
            "frontend log": fe.log(),
            "worker /metrics": m.metrics(),
            "frontend /metrics": fe.get("/metrics")[1],
            "discovery records": records,
            "nats-server log": broker.log_path.read_text(errors="replace"),
            "401 bodies": refusals,
            "frontend --help": frontend_help(env),
        }
    finally:
        if fe is not None:
            fe.stop()
        broker.stop()
    assert records and "Reconnected to NATS url=nats://dynamo:***@" in places["frontend log"]
    found = leaks(places, [hf_token, password, api_key, wrong_key])
    row.answered(len(found))
    assert found == []


async def refused_bodies(url: str, wrong_key: str) -> str:
    """The 401 bodies of a request with a wrong key and of one with none."""
    bodies = []
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=wrong_key, max_retries=0, timeout=30) as c:
        for headers in ({}, {"Authorization": openai.Omit()}):
            with pytest.raises(openai.AuthenticationError) as e:
                await c.chat.completions.create(
                    model=MODEL, messages=MESSAGES, max_tokens=3, extra_headers=headers
                )
            bodies.append(e.value.response.text)
    return "\n".join(bodies)


def frontend_help(env: dict[str, str]) -> str:
    """``python -m dynamo_worker.frontend --help`` with the key in its environment."""
    return subprocess.run(
        [sys.executable, "-m", "dynamo_worker.frontend", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


async def discovery_records(url: str) -> str:
    from dynamo_worker.runtime.discovery import open_instances_bucket
    from dynamo_worker.runtime.worker import connect_nats

    nc = await connect_nats(url, name="secrets-check")
    try:
        kv = await open_instances_bucket(nc)
        return "\n".join([(await kv.get(k)).value.decode() for k in await kv.keys()])
    finally:
        await nc.close()


def test_secrets_absent_from_operator_status_events_and_log(
    kc: Kubectl, operator: OperatorProcess, fault_row
):
    row = fault_row(
        "secrets absent (operator)",
        "envFromSecret, token env values and --api-key in args, one graph invalid; grep status, Events, log",
        0,
    )
    row.unit = "leaks"
    in_secret, literal, api_key, invalid = token("hf"), token("lit"), token("key"), token("bad")
    kc.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf-token"},
            "stringData": {"HF_TOKEN": in_secret},
        }
    )
    good = example("agg.yaml")
    decode = good["spec"]["services"]["decode"]
    decode["envFromSecret"] = "hf-token"
    decode["envs"] = [*decode.get("envs", []), {"name": "EXTRA_TOKEN", "value": literal}]
    decode["extraPodSpec"]["mainContainer"]["args"] += ["--api-key", api_key]
    kc.apply(good)
    bad = example("agg.yaml")  # invalid (no GPU limit) while it holds a token: the answer must not quote it
    bad["metadata"]["name"] = "sglang-agg-bad"
    del bad["spec"]["services"]["decode"]["resources"]
    bad["spec"]["services"]["decode"]["envs"] = [{"name": "HF_TOKEN", "value": invalid}]
    kc.apply(bad)
    kc.wait_ready("sglang-agg")
    cond = wait_until(
        lambda: (c := kc.condition("sglang-agg-bad")) and c["status"] == "False" and c,
        "the invalid graph's condition",
    )
    assert "resources.limits.gpu" in cond["message"], cond["message"]
    wait_until(lambda: kc.events("sglang-agg-bad", cond["reason"]), "the invalid graph's Event")
    time.sleep(1)  # let the operator log what it logs about both graphs
    places = {
        "status": json.dumps(
            [(kc.get("dgd", n) or {}).get("status") for n in ("sglang-agg", "sglang-agg-bad")]
        ),
        "Events": json.dumps(kc.list("events")),
        "operator log": operator.log_path.read_text(errors="replace"),
    }
    found = leaks(places, [in_secret, literal, api_key, invalid])
    row.answered(len(found))
    assert found == []
    # the literal value is where the user put it (the pod template), so the grep above could find it
    assert literal in json.dumps(kc.get("deployment", "sglang-agg-decode"))
