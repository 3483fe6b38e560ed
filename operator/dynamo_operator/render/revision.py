"""The revision of a graph's prefill/decode pair, and the graph's models. Pure.

A prefill and a decode worker can hand a KV cache over only when they agree on its layout and on the
model: the image (the SGLang version), the model and its tokenizer, ``--page-size``, the KV cache
dtype, the parallelism that splits the cache, the transfer backend. ``pair_revision`` hashes those facts
of every prefill and decode service of a graph together, so the pods of one rollout step share one
revision and a change of any of them (on either side) makes a new one. The operator renders it onto
those pods three ways:

- the env var ``DYN_REVISION``, which the worker publishes in discovery; the frontend pairs a prefill
  and a decode worker only within one revision (``dynamo_worker.frontend.models.pairing``);
- the label ``REVISION_LABEL``, by which the operator groups pods;
- the readiness gate ``PAIRED_CONDITION``: a pod is Ready only once its revision has a prefill and a
  decode pod whose containers are ready, which the operator states on the pods
  (``dynamo_operator.reconcile.pair_gate``). A rolling update removes old pods only as new ones become
  Ready, so the old revision keeps both roles serving until the new one has both.

Other changes to a pod template (an env var, resources, probes) keep the revision: the old and new pods
of such a rollout pair with each other, and the gate is set on new pods at once.

``graph_models`` are the served model names of the graph's language workers, which the frontend lists
and holds requests for even when their services are at 0 replicas (``DYN_GRAPH_MODELS``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Final

from dynamo_api.components import Component, components
from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.sglang_args import PP_FLAGS, TP_FLAGS, argv, flag_value, served_model_name

from dynamo_operator.config import OperatorConfig

__all__ = [
    "LAYOUT_FLAGS",
    "PAIRED_CONDITION",
    "REVISION_LABEL",
    "graph_models",
    "pair_revision",
    "paired_roles",
]

REVISION_LABEL: Final = "nvidia.com/dynamo-revision"
PAIRED_CONDITION: Final = "nvidia.com/dynamo-revision-paired"
# Flags whose values fix the KV layout or the model (SGLang's names; each group is one setting).
LAYOUT_FLAGS: Final[tuple[tuple[str, ...], ...]] = (
    ("--model-path", "--model"),
    ("--served-model-name",),
    ("--tokenizer-path",),
    ("--revision",),
    ("--page-size",),
    ("--kv-cache-dtype",),
    ("--dtype",),
    ("--quantization",),
    ("--context-length",),
    ("--load-format",),
    ("--disaggregation-transfer-backend",),
    TP_FLAGS,
    PP_FLAGS,
)
LANGUAGE_ROLES: Final = ("agg", "prefill", "decode")


def paired_roles(dgd: DynamoGraphDeployment) -> list[Component]:
    """The prefill and decode services of a disaggregated graph (none unless it has both)."""
    comps = [c for c in components(dgd) if c.kind == "worker" and c.role in ("prefill", "decode")]
    return comps if {c.role for c in comps} == {"prefill", "decode"} else []


def _facts(c: Component, config: OperatorConfig) -> dict[str, object]:
    tokens = argv(c.command_view)
    return {
        "service": c.name,
        "role": c.role,
        "image": c.user_container.get("image") or config.worker_image,
        "flags": [flag_value(tokens, *names) for names in LAYOUT_FLAGS],
    }


def pair_revision(dgd: DynamoGraphDeployment, config: OperatorConfig) -> str | None:
    """The revision of the graph's prefill/decode pods, or None when it is not disaggregated."""
    comps = paired_roles(dgd)
    if not comps:
        return None
    facts = [_facts(c, config) for c in comps]
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:10]


def graph_models(comps: Sequence[Component]) -> list[str]:
    """The served model names of the language workers among ``comps``, in order, once each."""
    names = [
        served_model_name(argv(c.command_view))
        for c in comps
        if c.kind == "worker" and c.role in LANGUAGE_ROLES
    ]
    return list(dict.fromkeys(n for n in names if n))
