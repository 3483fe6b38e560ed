"""dynamo-run end to end: every example (examples/**/*.yaml, multinode ones as the processes of their
ranks) served on the mocker as local processes, driven by the official openai client: streaming chat,
completions and usage counts, and the LoRA examples' adapters (their DynamoModels) by name and as
<base>:<adapter>; killing
the decode process makes requests fail with a clear error and dynamo-run reports it (keeping its log);
with --restart always, a multinode group one of whose ranks lost its engine restarts whole and serves
again;
SIGTERM stops every process dynamo-run started (checked by PID and process group) and leaves no
temporary file, even of a process that was killed. The planner example runs its planner, in dry-run
mode, deciding on the traffic the local frontend sees; a planner that dies is reported and the graph
serves on."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import openai
import pytest
from dynamo_worker.runtime.nats_server import free_port

from tests.support.dynamo_examples import DYNAMO_EXAMPLES, FIXTURES, serving
from tests.support.manifests import MODEL_KIND, documents
from tests.support.procs import group_members, popen
from tests.support.wait import wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# Not gateway.yaml (both versions): its endpoint picker serves a Gateway API gateway, which dynamo-run does
# not run; it refuses the graph (EppNotLocal, tests/unit/local/test_plan.py).
EXAMPLES = sorted(p for p in ROOT.glob("examples/**/*.yaml") if p.name != "gateway.yaml")
STARTUP_S = 120.0
STOP_S = 40.0


class DynamoRun:
    """``dynamo-run MANIFEST`` as a subprocess on a free port, its output collected line by line."""

    def __init__(
        self, manifest: Path, tmp: Path, cache: Path, *, log_dir: bool = True, extra: Sequence[str] = ()
    ) -> None:
        self.port = free_port()
        self.lines: list[str] = []
        self._lock = threading.Lock()
        argv = [
            str(Path(sys.executable).parent / "dynamo-run"), str(manifest), "--engine", "mocker",
            "--port", str(self.port), "--cache-dir", str(cache),
            "--startup-timeout", str(STARTUP_S), "--grace-period", "5", *extra,
        ]  # fmt: skip
        if log_dir:
            argv += ["--log-dir", str(tmp / "logs")]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "NATS_"))}
        self.tmpdir = tmp / "tmp"  # every temporary file of the run lands here, to check it is removed
        self.tmpdir.mkdir(exist_ok=True)
        env["TMPDIR"] = str(self.tmpdir)
        self.proc = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                with self._lock:
                    self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            match = re.search(pattern, self.output(), re.M)
            if match or self.proc.poll() is None:
                return match
            self._reader.join(5)
            match = re.search(pattern, self.output(), re.M)
            if not match:
                pytest.fail(
                    f"dynamo-run exited ({self.proc.returncode}) before {pattern!r}:\n{self.output()}"
                )
            return match

        return wait_until(
            found, f"{pattern!r} in the output", timeout_s=timeout, interval_s=0.1, explain=self.output
        )

    def started_pids(self) -> dict[str, int]:
        """Every process dynamo-run says it started, by name (nats-server included)."""
        found = {m[0]: int(m[1]) for m in re.findall(r"Started (\S+) pid=(\d+)", self.output())}
        nats = re.search(r"Started nats-server url=\S+ pid=(\d+)", self.output())
        if nats:
            found["nats-server"] = int(nats[1])
        return found

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0, timeout=30
        )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_S)
        finally:
            if self.proc.poll() is None:  # a failed test must not leave it behind
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            self._reader.join(5)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dynamo-run-cache")


@pytest.fixture
def dynamo_run(tmp_path, cache_dir):
    runs: list[DynamoRun] = []

    def start(example: str | Path, *, log_dir: bool = True, extra: Sequence[str] = ()) -> DynamoRun:
        run = DynamoRun(ROOT / "examples" / example, tmp_path, cache_dir, log_dir=log_dir, extra=extra)
        runs.append(run)
        run.wait_for(r"Serving namespace=", STARTUP_S + 30)
        return run

    yield start
    for run in runs:
        run.stop()


def check_serving(run: DynamoRun) -> str:
    with run.client() as client:
        return _check_serving(client)


def _check_serving(client: openai.OpenAI) -> str:
    models = [m.id for m in client.models.list().data]
    assert models, "the frontend lists no model"
    model = models[0]

    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello to the cluster."}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text
    assert usage is not None and usage.completion_tokens == 12 and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]

    completion = client.completions.create(
        model=model, prompt="The quick brown fox", max_tokens=7, extra_body={"ignore_eos": True}
    )
    assert completion.choices[0].text
    assert completion.usage is not None and completion.usage.completion_tokens == 7
    assert completion.usage.prompt_tokens > 0
    return model


def stop_and_check_nothing_left(run: DynamoRun) -> None:
    pids = run.started_pids()
    assert "nats-server" in pids and len(pids) >= 3, run.output()
    assert run.stop() == 0, run.output()
    left = {name: pid for name, pid in pids.items() if alive(pid) or group_members(pid)}
    assert left == {}, f"still running after SIGTERM: {left}\n{run.output()}"
    assert "Stopped" in run.output()
    left_files = [p.name for p in run.tmpdir.iterdir() if not p.name.startswith("dynamo-run-logs-")]
    assert left_files == [], "temporary files left behind"


def test_examples_are_found():
    assert {"agg.yaml", "disagg.yaml", "agg-multinode.yaml"} <= {p.name for p in EXAMPLES}


@pytest.mark.parametrize("example", EXAMPLES, ids=[str(p.relative_to(ROOT / "examples")) for p in EXAMPLES])
def test_every_example_serves_chat_and_completions_and_sigterm_leaves_nothing(dynamo_run, example):
    run = dynamo_run(example)
    if example.name.startswith("diffusion"):  # an image model: no chat, images instead
        check_image_generation(run)
    else:
        model = check_serving(run)
        if example.name.startswith("multimodal"):
            check_image_chat(run, model)
        if example.name.startswith("lora"):
            check_adapters(run, example)
    stop_and_check_nothing_left(run)


def check_adapters(run: DynamoRun, example: Path) -> None:
    """The file's DynamoModels: loaded on every worker (the Ready lines say where), listed with their
    parent, and served by name and as <base>:<adapter>."""
    models = documents(example, MODEL_KIND)
    assert models
    workers = sorted(n for n in run.started_pids() if n.startswith(("decode", "prefill")))
    with run.client() as client:
        listed = {m.id: m for m in client.models.list().data}
        for doc in models:
            name, base = doc["spec"]["modelName"], doc["spec"]["baseModelName"]
            ready_line = f"dynamo-run |   adapter: {name} (base {base}) on {', '.join(workers)}"
            assert ready_line in run.output().splitlines(), run.output()
            assert getattr(listed[name], "parent", None) == base, listed[name]
            for model in (name, f"{base}:{name}"):
                r = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "Hello adapter"}],
                    max_tokens=5,
                    extra_body={"ignore_eos": True},
                )
                assert r.choices[0].message.content and r.usage is not None and r.usage.completion_tokens == 5
    assert "was not loaded" not in run.output()


# Qwen/Qwen3-Embedding-0.6B's sentence-transformers modules: Transformer -> Pooling -> Normalize.
EMBEDDING_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


@pytest.mark.parametrize("example", serving(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_dynamo_sglang_example_serves_its_purpose(dynamo_run, example, tmp_path):
    """NVIDIA Dynamo's SGLang examples that serve here (tests/support/dynamo_examples.py), images changed
    only: chat and completions, embeddings from the embedding model (the model folder the mocker is
    given carries Qwen3-Embedding's modules.json, as the model's own files on a GPU node do, and no
    flag says so), images from the image-diffusion worker."""
    purpose = DYNAMO_EXAMPLES[str(example.relative_to(FIXTURES))].purpose
    extra: list[str] = []
    if purpose == "embeddings":
        from dynamo_worker.tinymodel import ensure_tiny_model

        model = ensure_tiny_model(tmp_path / "qwen3-embedding")
        (model / "modules.json").write_text(json.dumps(EMBEDDING_MODULES))
        extra = ["--model-dir", str(model)]
    run = dynamo_run(example, extra=extra)
    if purpose == "images":
        check_image_generation(run)
    elif purpose == "embeddings":
        with run.client() as client:
            model_id = client.models.list().data[0].id
            vectors = client.embeddings.create(model=model_id, input=["Hello world", "Hallo Welt"]).data
        assert (
            len(vectors) == 2
            and len(vectors[0].embedding) > 1
            and vectors[0].embedding != vectors[1].embedding
        )
    else:
        check_serving(run)
    stop_and_check_nothing_left(run)


def check_image_generation(run: DynamoRun) -> None:
    with run.client() as client:
        model = client.models.list().data[0].id
        images = client.images.generate(
            model=model, prompt="a fox", n=2, size="64x64", response_format="b64_json"
        )
    assert len(images.data) == 2 and all(
        base64.b64decode(d.b64_json or "").startswith(b"\x89PNG") for d in images.data
    )


def check_image_chat(run: DynamoRun, model: str) -> None:
    from dynamo_worker.multimodal.images import write_png

    image = "data:image/png;base64," + base64.b64encode(write_png(64, 64, b"\x10\x80\xf0" * 4096)).decode()
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": image}}]
    with run.client() as client:
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": content}],
            max_tokens=4,
            extra_body={"ignore_eos": True},
        )
    assert r.choices[0].message.content and r.usage is not None and r.usage.completion_tokens == 4


def test_disagg_serves_then_a_dead_decode_fails_requests_clearly_and_is_reported(dynamo_run):
    run = dynamo_run("disagg.yaml")
    model = check_serving(run)
    pids = run.started_pids()
    decode = next(name for name in pids if name.startswith("decode"))
    prefill = next(name for name in pids if name.startswith("prefill"))

    os.killpg(pids[decode], signal.SIGKILL)
    run.wait_for(rf"{decode} EXITED with signal SIGKILL", 30)
    with run.client() as client, pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "still there?"}], max_tokens=4
        )
    assert e.value.status_code in (500, 502, 503)
    assert e.value.message  # the frontend says why, in the OpenAI error shape
    assert alive(pids[prefill]) and run.proc.poll() is None  # the rest keeps serving

    stop_and_check_nothing_left(run)


def test_a_dead_frontend_stops_everything_with_exit_1(dynamo_run):
    run = dynamo_run("agg.yaml")
    pids = run.started_pids()
    os.killpg(pids["Frontend-0"], signal.SIGKILL)
    assert run.proc.wait(STOP_S) == 1, run.output()
    assert "Frontend-0 (the frontend) exited with signal SIGKILL" in run.output()
    assert list(run.tmpdir.iterdir()) == []  # what the killed frontend could not clean up is gone too
    left = {name: pid for name, pid in pids.items() if alive(pid) or group_members(pid)}
    assert left == {}, f"still running after the frontend died: {left}\n{run.output()}"


def test_the_temporary_log_folder_outlives_a_run_in_which_a_worker_died(dynamo_run):
    run = dynamo_run("agg.yaml", log_dir=False)
    logs = Path(run.wait_for(r"logs:\s+(\S+)", 5)[1])
    try:
        os.killpg(run.started_pids()["decode-0"], signal.SIGKILL)
        run.wait_for(r"decode-0 EXITED with signal SIGKILL", 30)
        stop_and_check_nothing_left(run)
        assert f"Kept the logs in {logs}" in run.output()
        assert (logs / "decode-0.log").is_file()  # where the EXITED report pointed
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def test_restart_always_restarts_a_multinode_group_whose_rank_lost_its_engine(dynamo_run):
    """Rank 1's engine dies (its scheduler process SIGKILLed): rank 1 exits, the leader hears it on its
    lifeline, hands back its requests and exits too, and dynamo-run starts the whole group again, as
    the operator restarts a group."""
    run = dynamo_run("agg-multinode.yaml", extra=["--restart", "always"])
    check_serving(run)
    scheduler = int(run.wait_for(r"node_rank=1 scheduler_pid=(\d+)", 10)[1])
    # The leader hears of rank 1 only once rank 1 is on its lifeline (it may serve a moment earlier).
    run.wait_for(r"Group rank joined the lifeline node_rank=1", 30)
    os.kill(scheduler, signal.SIGKILL)
    run.wait_for(r"Engine died: rank 1 of the 2-node group is gone", 30)
    run.wait_for(r"this worker leads a group of 2 nodes, whose ranks must start a new engine together", 30)
    # Either member's exit (rank 1's or the leader's, whichever dynamo-run sees first) restarts the group.
    run.wait_for(r"decode-0(-1)? EXITED with exit code [13]\b", 30)
    run.wait_for(r"Starting \S+ again: decode-0, decode-0-1", 30)
    wait_until(
        lambda: len(re.findall(r"^decode-0 +\| .*Worker ready", run.output(), re.M)) == 2,
        "the group's leader to register again",
        timeout_s=60,
        explain=run.output,
    )
    check_serving(run)
    stop_and_check_nothing_left(run)


PLANNER_INTERVAL_S = 2


def _gauge(url: str, name: str, labels: str = "") -> float | None:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)]
    return values[0] if values else None


def test_the_planner_example_runs_its_planner_in_dry_run_on_the_local_frontends_traffic(dynamo_run, tmp_path):
    example = (ROOT / "examples" / "disagg-planner.yaml").read_text()
    assert '"adjustment_interval": 60' in example
    manifest = tmp_path / "disagg-planner.yaml"  # the example, deciding every 2 s instead of every 60 s
    manifest.write_text(
        example.replace('"adjustment_interval": 60', f'"adjustment_interval": {PLANNER_INTERVAL_S}')
    )
    run = dynamo_run(manifest)
    assert run.output().count("so the planner runs with --dry-run") == 1, run.output()
    metrics = run.wait_for(r"planner: (http://127\.0\.0\.1:\d+/metrics)", 5)[1]
    # its first look at the frontend's counters; the next interval is the first it can decide on
    run.wait_for(r"^Planner-0 +\| .*First scrape of sources=1", 30)

    stop = threading.Event()
    completions: list[int] = []
    failures: list[BaseException] = []

    def load() -> None:  # requests one after the other until the planner has seen some
        try:
            with run.client() as client:
                while not stop.is_set():
                    r = client.completions.create(
                        model="Qwen/Qwen3-0.6B",
                        prompt="plan for me",
                        max_tokens=4,
                        extra_body={"ignore_eos": True},
                    )
                    completions.append(r.usage.completion_tokens if r.usage else 0)
        except openai.OpenAIError as e:
            failures.append(e)

    def observed() -> float | None:
        assert not failures, f"a request failed: {failures[0]!r}"
        rate = _gauge(metrics, "planner_observed_request_rate")
        return rate if rate and rate > 0 else None

    sender = threading.Thread(target=load, daemon=True)
    sender.start()
    try:
        wait_until(
            observed,
            "planner_observed_request_rate > 0 on the planner's /metrics",
            timeout_s=6 * PLANNER_INTERVAL_S + 20,
            interval_s=0.2,
            explain=run.output,
        )
    finally:
        stop.set()
        sender.join(30)
    assert completions and set(completions) == {4}
    # each decision is explained in its log with the traffic seen; the graph it read is the file's
    run.wait_for(
        r"^Planner-0 +\| .*(?:Decision:|Would scale) prefill prefill .*observed (?!0\.00)[\d.]+ req/s", 5
    )
    assert _gauge(metrics, "planner_current_replicas", 'role="prefill",service="prefill"') == 1.0

    # a planner that dies is reported, and the graph serves on without it
    os.killpg(run.started_pids()["Planner-0"], signal.SIGKILL)
    run.wait_for(r"Planner-0 \(the planner\) EXITED with signal SIGKILL; the graph keeps serving", 30)
    check_serving(run)
    stop_and_check_nothing_left(run)


def test_an_adapter_a_worker_refuses_is_reported_loudly_and_the_rest_serves(dynamo_run, tmp_path):
    """A DynamoModel of rank 64 beside lora-agg.yaml (--max-lora-rank 16): the worker's reason and fix in an
    error line and in the Ready line; the other adapters and the base model are served."""
    from dynamo_worker.tinymodel import ensure_tiny_model

    from tests.support.peft_adapters import write_adapter

    targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    write_adapter(
        ensure_tiny_model(tmp_path / "tiny"), tmp_path / "adapters" / "huge", rank=64, targets=targets
    )
    for name in ("customer-support", "sql-assistant"):
        shutil.copytree(ROOT / "examples" / "adapters" / name, tmp_path / "adapters" / name)
    huge = (
        "---\napiVersion: nvidia.com/v1alpha1\nkind: DynamoModel\nmetadata:\n  name: huge\nspec:\n"
        "  modelName: huge\n  baseModelName: Qwen/Qwen3-0.6B\n  modelType: lora\n"
        "  source:\n    uri: file://adapters/huge\n"
    )
    manifest = tmp_path / "lora-agg.yaml"
    manifest.write_text((ROOT / "examples" / "lora-agg.yaml").read_text() + huge)
    run = dynamo_run(manifest)
    error = run.wait_for(
        r"ERROR: DynamoModel huge \(adapter huge\) was not loaded on decode-0: RankTooLarge: (.*)", 5
    )
    assert "--max-lora-rank" in error[1]
    assert "dynamo-run |   adapter: huge (base Qwen/Qwen3-0.6B) on no worker; FAILED on 1" in run.output()
    with run.client() as client:
        assert {"customer-support", "sql-assistant"} <= {m.id for m in client.models.list().data}
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="huge", prompt="Hello", max_tokens=2)
        assert client.completions.create(model="sql-assistant", prompt="Hello", max_tokens=2).choices[0].text
    check_serving(run)
    stop_and_check_nothing_left(run)
