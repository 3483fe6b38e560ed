"""Status aggregation from observed children: per-service counts, multinode groups ready only when all
their workloads are, stale observedGeneration counts as not ready, and the Ready condition's message,
which names the first stuck pod of a service (unschedulable, image pull, crash loop, missing Secret)
with the pod's reason; the status merge patch (removed services are deleted, equal status is not
rewritten)."""

from dataclasses import dataclass

from dynamo_operator.reconcile.status import (
    MAX_POD_MESSAGE,
    ServiceCounts,
    all_counts,
    pod_problem,
    pod_problems,
    ready_condition,
    services_status,
    status_patch,
)

COMPONENT = "nvidia.com/dynamo-component"
GROUP = "nvidia.com/dynamo-group"


@dataclass(frozen=True)
class W:
    kind: str
    name: str
    pods: int


@dataclass(frozen=True)
class G:
    name: str
    workloads: tuple[W, ...]


@dataclass(frozen=True)
class Plan:
    kind: str
    replicas: int
    nodes_per_replica: int = 1
    children: tuple[str, ...] = ()
    groups: tuple[G, ...] = ()


def workload(kind, name, service, *, replicas, ready, updated=None, generation=1, observed=1, group=None):
    labels = {COMPONENT: service}
    if group:
        labels[GROUP] = group
    return {
        "kind": kind,
        "metadata": {"name": name, "labels": labels, "generation": generation},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": observed,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": ready if updated is None else updated,
        },
    }


def counts(plans, children):
    return all_counts(plans, children, component_label=COMPONENT, group_label=GROUP)


def test_deployments_ready_and_not_ready():
    plans = {"frontend": Plan("Deployment", 1), "decode": Plan("Deployment", 2)}
    children = [
        workload("Deployment", "g-frontend", "frontend", replicas=1, ready=1),
        workload("Deployment", "g-decode", "decode", replicas=2, ready=1),
        {"kind": "Service", "metadata": {"name": "g-frontend", "labels": {COMPONENT: "frontend"}}},
    ]
    c = counts(plans, children)
    assert services_status(c) == {
        "decode": {
            "componentKind": "Deployment",
            "componentName": "g-decode",
            "replicas": 2,
            "readyReplicas": 1,
            "updatedReplicas": 1,
        },
        "frontend": {
            "componentKind": "Deployment",
            "componentName": "g-frontend",
            "replicas": 1,
            "readyReplicas": 1,
            "updatedReplicas": 1,
        },
    }
    cond = ready_condition(c)
    assert (cond.status, cond.reason) == ("False", "ServicesNotReady")
    assert "decode 1/2 replicas ready" in cond.message and "frontend" not in cond.message


def test_all_ready():
    plans = {"frontend": Plan("Deployment", 1)}
    cond = ready_condition(
        counts(plans, [workload("Deployment", "g-frontend", "frontend", replicas=1, ready=1)])
    )
    assert (cond.status, cond.reason) == ("True", "AllServicesReady")


def test_stale_generation_is_not_ready():
    plans = {"decode": Plan("Deployment", 1)}
    child = workload("Deployment", "g-decode", "decode", replicas=1, ready=1, generation=2, observed=1)
    c = counts(plans, [child])
    assert c["decode"].ready == 0 and not c["decode"].is_ready


def test_rolling_update_is_not_ready_while_old_pods_remain():
    """A new template rolling out: the old pod is the ready one, the new pod exists but is not ready."""
    plans = {"decode": Plan("Deployment", 1)}
    child = workload("Deployment", "g-decode", "decode", replicas=1, ready=1, updated=1)
    child["status"]["replicas"] = 2  # old pod (ready) + new pod (updated, starting)
    c = counts(plans, [child])
    assert services_status(c)["decode"]["replicas"] == 2
    cond = ready_condition(c)
    assert cond.status == "False"
    assert "decode 1/1 replicas ready (2 exist)" in cond.message
    child["status"]["replicas"] = 1  # the old pod is gone
    assert ready_condition(counts(plans, [child])).status == "True"


def test_missing_child_is_not_ready():
    c = counts({"decode": Plan("Deployment", 1)}, [])
    assert (c["decode"].replicas, c["decode"].ready) == (0, 0)
    assert "decode 0/1 replicas ready (0 exist)" in ready_condition(c).message


def group(i: int) -> G:
    return G(f"g-decode-{i}", (W("StatefulSet", f"g-decode-{i}", 1), W("StatefulSet", f"g-decode-{i}-w", 1)))


def test_statefulset_group_ready_only_when_every_workload_is():
    plans = {"decode": Plan("StatefulSet", 2, nodes_per_replica=2, groups=(group(0), group(1)))}
    children = [
        workload("StatefulSet", "g-decode-0", "decode", replicas=1, ready=1, group="g-decode-0"),
        workload("StatefulSet", "g-decode-0-w", "decode", replicas=1, ready=1, group="g-decode-0"),
        workload("StatefulSet", "g-decode-1", "decode", replicas=1, ready=1, group="g-decode-1"),
        workload("StatefulSet", "g-decode-1-w", "decode", replicas=1, ready=0, group="g-decode-1"),
    ]
    c = counts(plans, children)["decode"]
    assert (c.replicas, c.ready, c.updated, c.is_ready) == (2, 1, 1, False)
    children[-1] = workload("StatefulSet", "g-decode-1-w", "decode", replicas=1, ready=1, group="g-decode-1")
    c = counts(plans, children)["decode"]
    assert (c.replicas, c.ready, c.is_ready) == (2, 2, True)
    assert c.as_status()["componentNames"] == ["g-decode-0", "g-decode-0-w", "g-decode-1", "g-decode-1-w"]


def test_extra_group_being_removed_keeps_service_not_ready():
    plans = {"decode": Plan("StatefulSet", 1, nodes_per_replica=2, groups=(group(0),))}
    children = [
        workload("StatefulSet", n, "decode", replicas=1, ready=1, group=g)
        for n, g in (
            ("g-decode-0", "g-decode-0"),
            ("g-decode-0-w", "g-decode-0"),
            ("g-decode-1", "g-decode-1"),
        )
    ]
    c = counts(plans, children)["decode"]
    assert (c.replicas, c.ready, c.is_ready) == (2, 1, False)


def test_lws_group():
    lws_group = G("g-decode-0", (W("LeaderWorkerSet", "g-decode-0", 2),))
    plans = {"decode": Plan("LeaderWorkerSet", 1, nodes_per_replica=2, groups=(lws_group,))}
    child = workload("LeaderWorkerSet", "g-decode-0", "decode", replicas=1, ready=0, group="g-decode-0")
    del child["status"]["observedGeneration"], child["metadata"]["generation"]
    assert counts(plans, [child])["decode"].ready == 0
    child["status"]["readyReplicas"] = child["status"]["updatedReplicas"] = 1
    assert counts(plans, [child])["decode"].is_ready


INSUFFICIENT = (
    "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available: "
    "2 No preemption victims found for incoming pod."
)


def pod(name, service="decode", *, conditions=(), waiting=None, phase="Pending", **extra_meta):
    status = {"phase": phase, "conditions": list(conditions)}
    if waiting is not None:
        status["containerStatuses"] = [{"name": "main", "state": {"waiting": waiting}}]
    return {"metadata": {"name": name, "labels": {COMPONENT: service}, **extra_meta}, "status": status}


def unschedulable(message=INSUFFICIENT):
    return {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}


def test_unschedulable_pod_names_the_scheduler_message():
    problem = pod_problem(pod("g-decode-abc", conditions=[unschedulable()]))
    assert problem.startswith("pod g-decode-abc is Unschedulable: 0/2 nodes are available: 2 Insufficient")
    assert "add nodes" in problem


def test_stuck_containers_name_the_kubelet_reason_and_the_fix():
    pull = pod("p", waiting={"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'})
    assert pod_problem(pull) == (
        'pod p container main is waiting: ImagePullBackOff: Back-off pulling image "nope:1" '
        "(check the image name and tag and the imagePullSecrets)"
    )
    secret = pod(
        "p", waiting={"reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}
    )
    assert 'CreateContainerConfigError: secret "hf-token" not found' in pod_problem(secret)
    assert "Secret" in pod_problem(secret)
    crash = pod("p", phase="Running", waiting={"reason": "CrashLoopBackOff"})
    assert "is waiting: CrashLoopBackOff (see `kubectl logs --previous`" in pod_problem(crash)


def test_a_container_oom_killed_at_its_limit_is_named_until_it_is_ready_again():
    oom = pod("p", phase="Running", waiting={"reason": "CrashLoopBackOff"})
    oom["status"]["containerStatuses"][0] |= {
        "restartCount": 2,
        "lastState": {"terminated": {"reason": "OOMKilled"}},
    }
    assert pod_problem(oom) == (
        "pod p container main was OOMKilled at its memory limit (restarted 2 times; raise the service's "
        "resources.limits.memory)"
    )
    oom["status"]["containerStatuses"][0] |= {"ready": True, "state": {"running": {}}}
    assert pod_problem(oom) is None


def test_pods_that_are_merely_starting_or_going_are_not_stuck():
    assert pod_problem(pod("p", waiting={"reason": "ContainerCreating"})) is None
    assert pod_problem(pod("p", conditions=[{"type": "PodScheduled", "status": "True"}])) is None
    assert pod_problem(pod("p", phase="Running")) is None
    going = pod("p", conditions=[unschedulable()], deletionTimestamp="2026-01-01T00:00:00Z")
    assert pod_problem(going) is None


def test_long_messages_are_bounded_to_one_line():
    problem = pod_problem(pod("p", conditions=[unschedulable("x\n" * 500)]))
    assert "\n" not in problem and "x x x... (lower the service's resources" in problem
    assert len(problem) < MAX_POD_MESSAGE + 100


def test_first_stuck_pod_per_service_is_chosen_by_name():
    pods = [
        pod("g-decode-b", conditions=[unschedulable("b")]),
        pod("g-decode-a", phase="Running"),
        pod("g-decode-c", conditions=[unschedulable("c")]),
        pod("g-prefill-x", "prefill", waiting={"reason": "ErrImagePull"}),
        {"metadata": {"name": "unlabelled"}, "status": {"conditions": [unschedulable()]}},
    ]
    problems = pod_problems(pods, component_label=COMPONENT)
    assert problems == {
        "decode": "pod g-decode-b is Unschedulable: b (lower the service's resources or add nodes "
        "that can hold the pod)",
        "prefill": "pod g-prefill-x container main is waiting: ErrImagePull (check the image name and "
        "tag and the imagePullSecrets)",
    }


def test_ready_message_says_why_a_service_is_not_ready():
    plans = {"decode": Plan("Deployment", 1), "frontend": Plan("Deployment", 1)}
    children = [
        workload("Deployment", "g-decode", "decode", replicas=1, ready=0),
        workload("Deployment", "g-frontend", "frontend", replicas=1, ready=1),
    ]
    problems = pod_problems([pod("g-decode-abc", conditions=[unschedulable()])], component_label=COMPONENT)
    problems["frontend"] = "ignored: the service is ready"
    cond = ready_condition(counts(plans, children), "g=x", problems)
    assert (cond.status, cond.reason) == ("False", "ServicesNotReady")
    assert cond.message.startswith(
        "Waiting for decode 0/1 replicas ready, pod g-decode-abc is Unschedulable: 0/2 nodes are available: "
        "2 Insufficient nvidia.com/gpu."
    )
    assert "ignored" not in cond.message and "`kubectl get pods -l g=x`" in cond.message


def test_status_patch():
    current = {"state": "pending", "services": {"a": {"replicas": 1}, "gone": {"replicas": 1}}}
    new = {"state": "successful", "services": {"a": {"replicas": 1}}}
    assert status_patch(current, new) == {
        "status": {"state": "successful", "services": {"a": {"replicas": 1}, "gone": None}}
    }
    assert status_patch({**new, "extra": 1}, new) is None


def test_ready_condition_points_at_the_pods():
    counts = {"decode": ServiceCounts("Deployment", 1, 0, 0, 1)}
    cond = ready_condition(counts, "nvidia.com/dynamo-graph-deployment-name=g")
    assert "kubectl get pods -l nvidia.com/dynamo-graph-deployment-name=g" in cond.message
