"""dynamo-run's main sequence: read, decide, start, wait, serve, stop.

1. Read the manifest with dynamo_api's models and validation (the operator's Problems, word
   for word); choose the engine (and say why); plan the processes. Any problem here exits 2 before
   anything starts.
2. Start an embedded nats-server, then every process at once; wait for each to be ready (workers:
   ``/health`` on their system port, true once registered in discovery; the frontend: ``/health``,
   true once a model is listed, and its ``/metrics`` showing every worker), printing what is pending
   every few seconds. A process that exits during startup fails the run at once with its last log
   lines (exit 1). Then start the planner, if the graph has one: it reads the frontend's metrics, so
   its first look finds them served. Then load the LoRA adapters of the file's DynamoModels on the
   workers serving their base models (``local.loras``), and say so in the Ready lines.
3. Print where to send requests, then watch. A worker that dies is reported loudly with its last
   log lines and the rest keeps serving: the frontend answers requests that need it with an error, or
   holds them while no worker of the model is left (503 after ``--scale-up-timeout-s``). A planner
   that dies is reported the same way; the graph serves on at the manifest's replicas. By default
   dynamo-run restarts neither, so a failure stays visible; restart dynamo-run to get it back. With
   ``--restart always`` a dead worker is started again as Kubernetes would (``restart_backoff``), with every
   pod of its multinode group, and so is the frontend (nats-server at once, on its port with its
   store); otherwise the frontend or NATS dying stops everything (exit 1).
4. On SIGINT/SIGTERM: SIGTERM to every process group, the grace period, SIGKILL; stop NATS; remove
   temporary state (NATS store; the children's TMPDIR; the log folder unless a process failed or
   --log-dir was given).
   A second Ctrl-C kills at once.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dynamo_api.models import DynamoGraphDeployment

from dynamo_worker.local.engine_choice import choose_engine, probe_host
from dynamo_worker.local.loras import Adapter, adapters_of, load_adapters, ready_lines
from dynamo_worker.local.manifest import ManifestError, load_manifest, load_models
from dynamo_worker.local.plan import Plan, PlanError, machine_env, plan_graph
from dynamo_worker.local.restart_backoff import RestartBackoff
from dynamo_worker.local.settings import RunSettings
from dynamo_worker.local.signals import handled
from dynamo_worker.local.supervisor import Child, Console, Supervisor, SupervisorError
from dynamo_worker.runtime.children import die_with_parent
from dynamo_worker.runtime.nats_server import NatsServer, NatsServerError, free_port

__all__ = ["EXIT_FAILED", "EXIT_INVALID", "EXIT_OK", "run"]

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
WATCH_INTERVAL_S = 0.5


class _PortAllocator:
    """Free 127.0.0.1 ports, never the same one twice in a run."""

    def __init__(self, taken: set[int]) -> None:
        self.taken = set(taken)

    def __call__(self) -> int:
        for _ in range(100):
            port = free_port()
            if port not in self.taken:
                self.taken.add(port)
                return port
        raise RuntimeError("could not find a free port after 100 tries")


def _port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, or None when it can."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the frontend's server does
        try:
            sock.bind((host, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def _tiny_model(settings: RunSettings) -> Path:
    from dynamo_worker.tinymodel import ensure_tiny_model

    return ensure_tiny_model(settings.cache_dir / "tiny-model")


def _banner(plan: Plan, engine: str, log_dir: Path, api_key: bool, adapters: Sequence[str] = ()) -> list[str]:
    model = plan.served_models[0] if plan.served_models else "MODEL"
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32})
    planners = [
        f"  planner: {p.metrics_url}   ({p.name}: planner_* metrics; its decisions are its log lines)"
        for p in plan.processes
        if p.kind == "planner"
    ]
    return [
        f"Serving namespace={plan.namespace} engine={engine}",
        f"  models:  {', '.join(plan.served_models) or '(none found in the manifest)'}",
        *adapters,
        f"  OpenAI:  {plan.url}/v1   (base_url for the openai client; "
        + (
            "api_key: the key in $DYN_API_KEY or $DYN_API_KEY_FILE)" if api_key else "api_key is not checked)"
        ),
        f"  try:     curl -sN {plan.url}/v1/chat/completions -H 'Content-Type: application/json' "
        + ('-H "Authorization: Bearer $DYN_API_KEY" ' if api_key else "")
        + f"-d {shlex.quote(body)}",
        *planners,
        f"  logs:    {log_dir}",
        "Ctrl-C stops every process.",
    ]


class _Run:
    """The state of one run: the stop request, the supervisor, the temporary folders."""

    def __init__(self, manifest: Path, settings: RunSettings, console: Console) -> None:
        self.manifest = manifest
        self.settings = settings
        self.console = console
        self.stopping = threading.Event()
        self.supervisor: Supervisor | None = None
        self.signals = 0
        self.nats_port = 0  # chosen in prepare(), before the plan that points every process at it
        self.process_died = False  # one exited while serving: its log must outlive the run
        self.dgd: DynamoGraphDeployment | None = None
        self.adapters: list[Adapter] = []  # the file's DynamoModels, loaded once the workers are up
        self.backoffs: dict[str, RestartBackoff] = {}  # per pod, or per multinode group
        self.restarts_due: dict[str, float] = {}  # pod or group -> when to start it again (monotonic)

    def on_signal(self, sig: signal.Signals) -> None:
        """SIGINT or SIGTERM, on the signal thread (``local.signals``): the first stops the run, a second
        kills every process at once."""
        self.signals += 1
        if self.signals == 1:
            log.info("Stopping on %s (again to kill at once)", sig.name)
            self.stopping.set()
        elif self.supervisor is not None:
            log.warning("Killing every process now")
            self.supervisor.kill()

    def prepare(self) -> tuple[Plan, str] | None:
        """Read, choose, plan; None (after logging why) when the manifest cannot run here."""
        try:
            dgd = load_manifest(self.manifest)
            models = load_models(self.manifest)
        except ManifestError as e:  # unreadable, or refused by the operator's own validation
            log.error("%s", e)
            return None
        folder = self.settings.adapter_dir or self.manifest.resolve().parent
        self.dgd, self.adapters = dgd, adapters_of(models, folder)
        busy = _port_in_use(self.settings.host, self.settings.port)
        if busy:
            log.error(
                "Port %s on %s is not free (%s); stop what listens there or pass --port",
                self.settings.port,
                self.settings.host,
                busy,
            )
            return None
        if self.settings.model_dir is not None and not self.settings.model_dir.is_dir():
            log.error(
                "--model-dir %s is not a folder; pass the folder holding the model's tokenizer (and, for "
                "SGLang, its weights), or drop the flag",
                self.settings.model_dir,
            )
            return None
        facts = probe_host(self.settings.cuda_visible_devices)
        choice = choose_engine(self.settings.engine, facts)
        log.info("Engine %s: %s", choice.engine, choice.reason)
        nats_port = free_port()
        model_dir = str(self.settings.model_dir) if self.settings.model_dir else None
        mocker_dir = model_dir
        if choice.engine == "mocker" and model_dir is None:
            mocker_dir = str(_tiny_model(self.settings))
            log.info("Mocker model folder %s (a tiny tokenizer; --model-dir to use another)", mocker_dir)
        try:
            plan = plan_graph(
                dgd,
                engine=choice.engine,
                nats_url=f"nats://127.0.0.1:{nats_port}",
                http_host=self.settings.host,
                http_port=self.settings.port,
                mocker_model_dir=mocker_dir,
                sglang_model_path=model_dir,
                gpus=facts.gpus,
                free_port=_PortAllocator({nats_port, self.settings.port}),
                graph_file=str(self.manifest.resolve()),
                machine=machine_env(
                    http_host=self.settings.host,
                    grace_s=self.settings.grace_period,
                    # The pods' `python3` is this interpreter, as in the image; then this shell's PATH.
                    path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
                ),
            )
        except PlanError as e:
            log.error("%s cannot run here:\n%s", self.manifest, e)
            return None
        if choice.engine == "sglang" and not facts.sglang_importable:
            log.error(
                "--engine sglang needs SGLang, which %s cannot import; install it with pip install "
                "'dynamo-sglang[sglang]' (pins sglang==0.5.17, needs CUDA GPUs), or run with --engine mocker",
                sys.executable,
            )
            return None
        for note in plan.notes:
            log.info("Note: %s", note)
        self.nats_port = nats_port
        return plan, choice.engine

    def serve(self, plan: Plan, engine: str) -> int:
        log_dir = self.settings.log_dir or Path(tempfile.mkdtemp(prefix="dynamo-run-logs-"))
        keep_logs = self.settings.log_dir is not None
        # The children's temporary files (the frontend's model cards, SGLang's IPC sockets) go to a
        # folder of this run, removed at the end even when a child was killed before cleaning up.
        run_tmp = Path(tempfile.mkdtemp(prefix="dynamo-run-tmp-"))
        processes = [replace(p, env={"TMPDIR": str(run_tmp), **p.env}) for p in plan.processes]
        nats = NatsServer(port=self.nats_port, command_prefix=die_with_parent())
        status = EXIT_FAILED
        try:
            nats.start()
            self.supervisor = Supervisor(log_dir, self.console, grace_s=self.settings.grace_period + 5.0)
            self.supervisor.start([p for p in processes if p.kind != "planner"])
            if not self.supervisor.wait_ready(self.settings.startup_timeout_for(engine), self.stopping):
                status = EXIT_OK
                return status
            self.supervisor.start([p for p in processes if p.kind == "planner"])
            assert self.dgd is not None  # set by prepare()
            loaded = load_adapters(plan, self.dgd, self.adapters)
            for line in _banner(plan, engine, log_dir, self.settings.frontend_api_key, ready_lines(loaded)):
                log.info("%s", line)
            status = self.watch(nats)
            return status
        except (SupervisorError, NatsServerError) as e:
            log.error("Startup failed: %s", e)
            return status
        finally:
            if self.supervisor is not None:
                self.supervisor.stop()
            nats.stop()
            shutil.rmtree(run_tmp, ignore_errors=True)
            if status == EXIT_OK and not keep_logs and not self.process_died:
                shutil.rmtree(log_dir, ignore_errors=True)
            elif not keep_logs:
                log.info("Kept the logs in %s", log_dir)

    def watch(self, nats: NatsServer) -> int:
        """Report every process that dies; EXIT_OK when stopped, EXIT_FAILED when serving is over."""
        assert self.supervisor is not None
        while not self.stopping.wait(WATCH_INTERVAL_S):
            if nats.proc is None or nats.proc.poll() is not None:
                if self.settings.restart != "always":
                    log.error("nats-server exited; stopping everything. Its last lines:\n%s", nats.log_tail())
                    return EXIT_FAILED
                log.error(
                    "nats-server EXITED; starting it again on its port. Its last lines:\n%s", nats.log_tail()
                )
                self.process_died = True
                try:
                    nats.start()
                except NatsServerError as e:
                    log.error("nats-server could not start again, stopping everything: %s", e)
                    return EXIT_FAILED
            for child in self.supervisor.dead():
                if child.reported_exit:
                    continue
                child.reported_exit = True
                self.process_died = True
                if child.spec.kind == "frontend" and self.settings.restart != "always":
                    log.error(
                        "%s (the frontend) exited with %s; nothing can serve requests, stopping everything. "
                        "Its last log lines (%s):\n%s",
                        child.spec.name,
                        child.describe_exit(),
                        child.log_path,
                        child.tail_text(),
                    )
                    return EXIT_FAILED
                if child.spec.kind == "planner":
                    log.error(
                        "%s (the planner) EXITED with %s; the graph keeps serving at the manifest's "
                        "replicas, with no planning decisions. dynamo-run does not restart it: stop (Ctrl-C) "
                        "and run again to bring it back. Its last log lines (%s):\n%s",
                        child.spec.name,
                        child.describe_exit(),
                        child.log_path,
                        child.tail_text(),
                    )
                    continue
                self._worker_died(child)
            self._restart_due()
        return EXIT_OK

    def _worker_died(self, child: Child) -> None:
        assert self.supervisor is not None
        alive = [c.spec.name for c in self.supervisor.children if c.alive() and c.spec.kind == "worker"]
        key = child.spec.group or child.spec.name
        if self.settings.restart == "always" and key in self.restarts_due:
            then = f"Its group {key} is starting again (--restart always)"
        elif self.settings.restart == "always":
            backoff = self.backoffs.setdefault(key, RestartBackoff())
            delay = backoff.delay(time.monotonic() - child.started)
            self.restarts_due[key] = time.monotonic() + delay
            what = f"its group {key}" if child.spec.group else "it"
            then = f"Starting {what} again in {delay:.0f}s (restart {backoff.restarts}, --restart always)"
        else:
            then = "dynamo-run does not restart it (--restart never): stop (Ctrl-C) and run again"
        impact = (
            "Nothing serves requests until it is back (clients' connections are refused)"
            if child.spec.kind == "frontend"
            else f"Requests that need a {child.spec.service} worker now fail with an error (503 once none is "
            f"left); still serving: {', '.join(alive) or 'no worker'}"
        )
        log.error(
            "%s EXITED with %s. %s. %s. Its last log lines (%s):\n%s",
            child.spec.name,
            child.describe_exit(),
            impact,
            then,
            child.log_path,
            child.tail_text(),
        )

    def _restart_due(self) -> None:
        """Start again the pods (every pod of a group) whose restart is due."""
        assert self.supervisor is not None
        now = time.monotonic()
        for key, due in list(self.restarts_due.items()):
            if now < due:
                continue
            del self.restarts_due[key]
            members = [c for c in self.supervisor.children if (c.spec.group or c.spec.name) == key]
            log.warning("Starting %s again: %s", key, ", ".join(c.spec.name for c in members))
            self.supervisor.restart(members)


def run(manifest: Path, settings: RunSettings, console: Console) -> int:
    """Serve ``manifest`` until SIGINT/SIGTERM or a fatal failure; the exit status."""
    state = _Run(manifest, settings, console)
    with handled((signal.SIGINT, signal.SIGTERM), state.on_signal):
        prepared = state.prepare()
        if prepared is None:
            return EXIT_INVALID
        if state.stopping.is_set():  # Ctrl-C while reading the manifest or making the tiny model
            return EXIT_OK
        return state.serve(*prepared)
