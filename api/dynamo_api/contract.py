"""The launch contract between the operator (and dynamo-run) and the processes in the pods.

Every environment variable, port and command-line flag that the operator writes onto a pod and that
``dynamo_worker`` reads is declared here, once. Both sides import these names, so they cannot drift.
Every port default of both packages is here too (the ports section), also those of the operator's own
pod and SGLang's that the mocker accepts: one place to look a port up.
Which module a pod runs, and NVIDIA Dynamo's names for them, is ``modules`` (the engine-swap table).
"""

from __future__ import annotations

from typing import Final

# --- environment variables set on every pod of a graph -------------------------------------------
ENV_NAMESPACE: Final = "DYN_NAMESPACE"  # "<k8s-namespace>-<dgd-name>": scopes discovery and events
ENV_COMPONENT: Final = "DYN_COMPONENT"  # the service name in spec.services, e.g. "decode"
ENV_ENDPOINT: Final = "DYN_ENDPOINT"  # the request-plane endpoint a worker serves ("generate")
ENV_SYSTEM_PORT: Final = "DYN_SYSTEM_PORT"  # /live, /health, /metrics
ENV_SYSTEM_ENABLED: Final = "DYN_SYSTEM_ENABLED"
ENV_REQUEST_PORT: Final = "DYN_REQUEST_PORT"  # the worker's request-plane listener (0: any free port)
ENV_ADVERTISE_HOST: Final = "DYN_ADVERTISE_HOST"  # the host peers use to reach this process
ENV_LISTEN_HOST: Final = "DYN_LISTEN_HOST"  # interface the worker's servers bind to (default 0.0.0.0)
ENV_GRACEFUL_SHUTDOWN_S: Final = "DYN_GRACEFUL_SHUTDOWN_S"  # drain time on SIGTERM
ENV_MAX_INFLIGHT: Final = "DYN_MAX_INFLIGHT"  # requests a worker serves at once before 'overloaded'
ENV_NATS_SERVER: Final = "NATS_SERVER"  # nats://host:port, discovery + event plane
ENV_DISCOVERY_TTL: Final = "DYN_DISCOVERY_TTL"  # seconds a registration lives without a heartbeat
ENV_HTTP_PORT: Final = "DYN_HTTP_PORT"  # the frontend's OpenAI port
ENV_ROUTER_MODE: Final = "DYN_ROUTER_MODE"  # round-robin | random | kv
ENV_HTTP_HOST: Final = "DYN_HTTP_HOST"  # the frontend's listen address (0.0.0.0 in pods)
ENV_KV_OVERLAP_WEIGHT: Final = "DYN_KV_OVERLAP_WEIGHT"  # kv router: weight of uncached prompt blocks
ENV_HTTP_MAX_INFLIGHT: Final = "DYN_HTTP_MAX_INFLIGHT"  # frontend: requests at once before 503
ENV_LOG_FORMAT: Final = "DYN_LOG_FORMAT"  # text | json
# Prefill and decode pods of a graph: the revision of the pair (what fixes the KV layout and the
# model), which the worker publishes in discovery and the frontend pairs on.
ENV_REVISION: Final = "DYN_REVISION"
# The frontend of a graph: the models its workers serve, listed and held for even at 0 replicas.
ENV_GRAPH_MODELS: Final = "DYN_GRAPH_MODELS"
ENV_LOG_LEVEL: Final = "DYN_LOG_LEVEL"
# The endpoint picker of a graph: the frontend replicas it sends requests to, host:port comma-separated
# (the headless Service of each frontend, which names every ready pod): its --frontends.
ENV_EPP_FRONTENDS: Final = "DYN_EPP_FRONTENDS"
# The frontend's API key(s), from a Secret (a graph's frontend env, or the chart's frontend.apiKey through
# the operator); never logged. The file form holds one key a line.
ENV_API_KEY: Final = "DYN_API_KEY"
ENV_API_KEY_FILE: Final = "DYN_API_KEY_FILE"
# Set by the runtime image, not the operator: what `python -m dynamo.sglang` runs (sglang | mocker).
ENV_SGLANG_ENGINE: Final = "DYN_SGLANG_ENGINE"
ENV_POD_NAME: Final = "POD_NAME"
ENV_POD_NAMESPACE: Final = "POD_NAMESPACE"
ENV_POD_IP: Final = "POD_IP"
ENV_GRAPH_NAME: Final = "DYN_PARENT_DGD_K8S_NAME"
ENV_GRAPH_NAMESPACE: Final = "DYN_PARENT_DGD_K8S_NAMESPACE"
# Multinode groups (one engine over N pods): set on every pod of a group.
ENV_NODE_RANK: Final = "DYN_NODE_RANK"  # 0 on the leader, 1..N-1 on the others (from the pod-index label)
ENV_NUM_NODES: Final = "DYN_NUM_NODES"  # N, the pods of one group
ENV_LEADER_HOST: Final = "DYN_LEADER_HOST"  # the stable DNS name of the group's leader pod
# host:port of the leader's system server: the other ranks hold a lifeline to it (runtime.group)
ENV_LEADER_SYSTEM_ADDR: Final = "DYN_LEADER_SYSTEM_ADDR"

# --- ports --------------------------------------------------------------------------------------
FRONTEND_PORT: Final = 8000  # the OpenAI API (container port and Service port "http")
SYSTEM_PORT: Final = 9090  # a worker's or planner's /live, /health, /metrics (container port "system")
EPP_PORT: Final = 9002  # the endpoint picker's ext_proc gRPC server and its gRPC health (GAIE's port)
EPP_PORT_NAME: Final = "grpc"  # its container port and Service port (an InferencePool's endpointPickerRef)
REQUEST_PORT: Final = 9100  # a worker's request-plane listener (container port "request")
NATS_PORT: Final = 4222
DIST_INIT_PORT: Final = 29500  # a multinode engine's --dist-init-addr on its leader ("dist-init")
# A prefill worker's bootstrap server (decode workers fetch its KV cache through it). SGLang's own default,
# which a rendered prefill pod always carries as BOOTSTRAP_PORT_FLAG (unless its manifest gives one) and
# declares as container port "bootstrap", so that the port it binds is the port it declares, and anything
# that remaps a pod's ports (dynamo-run on one host) remaps it too. A worker started without the flag
# (by hand, not from a manifest) binds a free port and publishes it in discovery, the SGLang worker and
# the mocker alike, so two of them on one host never collide.
DEFAULT_BOOTSTRAP_PORT: Final = 8998
BOOTSTRAP_PORT_FLAG: Final = "--disaggregation-bootstrap-port"
# SGLang's KV events publisher (ZMQ), wired by the operator when the graph's frontend routes on KV.
# A data-parallel engine binds one port per rank: KV_EVENTS_PORT + rank.
KV_EVENTS_PORT: Final = 5557
KV_EVENTS_PORT_NAME: Final = "kv-events"  # rank r > 0: "kv-events-dp<r>"
KV_EVENTS_FLAG: Final = "--kv-events-config"
ROUTER_MODE_FLAG: Final = "--router-mode"
# SGLang's own HTTP server (--port): the mocker accepts the flag and serves nothing on it.
SGLANG_HTTP_PORT: Final = 30000
# The operator's own pod (charts/dynamo-operator/values.yaml says the same: operator.healthPort and
# operator.webhook.port).
OPERATOR_LIVENESS_PORT: Final = 8080  # GET /healthz
OPERATOR_WEBHOOK_PORT: Final = 9443  # HTTPS: conversion (POST /convert) and admission

# --- HTTP paths of the system server ------------------------------------------------------------
LIVE_PATH: Final = "/live"
HEALTH_PATH: Final = "/health"
METRICS_PATH: Final = "/metrics"

# --- the request plane ----------------------------------------------------------------------------
DEFAULT_ENDPOINT: Final = "generate"
DEFAULT_DISCOVERY_TTL_S: Final = 10.0
