"""Readiness gates of a disaggregated graph's prefill and decode pods: a revision's pods get their gate
once it has a prefill and a decode pod whose containers are ready, never before, never the old
revision's pods because of the new revision's, never pods being deleted; a multinode member does not
stand for its group; a gate once open is left alone."""

from __future__ import annotations

from dynamo_operator.reconcile.pair_gate import gates_to_open, paired_condition, waits_for_gate
from dynamo_operator.render import labels
from dynamo_operator.render.lora_gate import LORA_GATE_CONDITION
from dynamo_operator.render.revision import PAIRED_CONDITION, REVISION_LABEL

ROLES = {"prefill": "prefill", "decode": "decode", "Frontend": None}


def pod(
    name: str,
    service: str,
    revision: str,
    *,
    containers_ready: bool = True,
    gate: str | None = None,
    deleting: bool = False,
    member: bool = False,
) -> dict:
    conditions = [{"type": "ContainersReady", "status": "True" if containers_ready else "False"}]
    if gate is not None:
        conditions.append({"type": PAIRED_CONDITION, "status": gate})
    meta_labels = {labels.COMPONENT: service, REVISION_LABEL: revision}
    if member:
        meta_labels[labels.MULTINODE_ROLE] = "worker"
    meta: dict = {"name": name, "labels": meta_labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"readinessGates": [{"conditionType": PAIRED_CONDITION}]},
        "status": {"conditions": conditions},
    }


def test_a_revision_with_both_roles_serving_gets_its_gates():
    pods = [pod("p1", "prefill", "r1"), pod("d1", "decode", "r1")]
    assert gates_to_open(pods, ROLES) == ["d1", "p1"]
    assert all(waits_for_gate(p) for p in pods)


def test_one_role_serving_is_not_enough():
    pods = [pod("p1", "prefill", "r1"), pod("d1", "decode", "r1", containers_ready=False)]
    assert gates_to_open(pods, ROLES) == []


def test_a_rollout_opens_the_new_revision_only_once_it_has_both_roles():
    old = [pod("p-old", "prefill", "r1", gate="True"), pod("d-old", "decode", "r1", gate="True")]
    new_prefill = pod("p-new", "prefill", "r2")
    new_decode = pod("d-new", "decode", "r2", containers_ready=False)
    assert gates_to_open([*old, new_prefill, new_decode], ROLES) == []
    new_decode = pod("d-new", "decode", "r2")
    assert gates_to_open([*old, new_prefill, new_decode], ROLES) == ["d-new", "p-new"]


def test_a_new_pod_of_a_paired_revision_gets_its_gate_at_once():
    pods = [pod("p1", "prefill", "r1", gate="True"), pod("d1", "decode", "r1", gate="True")]
    pods.append(pod("d2", "decode", "r1", containers_ready=False))
    assert gates_to_open(pods, ROLES) == ["d2"]
    assert not waits_for_gate(pods[0]) and waits_for_gate(pods[2])


def test_pods_being_deleted_and_group_members_do_not_count():
    pods = [pod("p1", "prefill", "r1", deleting=True), pod("d1", "decode", "r1")]
    assert gates_to_open(pods, ROLES) == []
    assert not waits_for_gate(pods[0])
    pods = [pod("p1-1", "prefill", "r1", member=True), pod("d1", "decode", "r1")]
    assert gates_to_open(pods, ROLES) == []
    pods.append(pod("p1-0", "prefill", "r1"))
    assert gates_to_open(pods, ROLES) == ["d1", "p1-0", "p1-1"]


def test_the_patch_sets_only_the_gate_condition():
    patch = paired_condition("2026-01-01T00:00:00Z")
    (cond,) = patch["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (PAIRED_CONDITION, "True", "RevisionPaired")


def test_a_lora_worker_pairs_only_once_it_holds_its_adapters():
    """With the LoRA gate (render.lora_gate), a revision is paired once both roles hold their adapters:
    the new prefill is not Ready (so the old one stays) while the new decode is still loading them."""

    def lora(p: dict, loaded: str | None) -> dict:
        p["spec"]["readinessGates"].append({"conditionType": LORA_GATE_CONDITION})
        if loaded is not None:
            p["status"]["conditions"].append({"type": LORA_GATE_CONDITION, "status": loaded})
        return p

    loading = [lora(pod("p1", "prefill", "r2"), "True"), lora(pod("d1", "decode", "r2"), None)]
    assert gates_to_open(loading, ROLES) == []
    loaded = [lora(pod("p1", "prefill", "r2"), "True"), lora(pod("d1", "decode", "r2"), "True")]
    assert gates_to_open(loaded, ROLES) == ["d1", "p1"]
