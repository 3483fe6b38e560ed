"""``render(dgd, config) -> Rendered``: the whole desired state of one graph. Pure and deterministic.

No I/O, no clock, no randomness, no environment: the same DynamoGraphDeployment and OperatorConfig
give byte-identical objects. Invalid specs give ``problems`` and no objects.

What a graph becomes (names: ``<graph>-<service lowercased>``, hashed when too long):

- frontend: a Service (``http`` 8000) and a Deployment running ``python3 -m dynamo_worker.frontend``;
- worker / prefill / decode on one node: a Deployment (container ``main``, ports ``system`` 9090,
  ``request`` 9100, and ``bootstrap`` on prefill pods);
- worker / prefill / decode with ``multinode.nodeCount: N``: per replica ``i`` one group
  ``<graph>-<service>-<i>``: with ``config.group_backend == "lws"`` a LeaderWorkerSet of size N
  (``RecreateGroupOnPodRestart``); with ``"statefulset"`` a headless Service plus a leader
  StatefulSet (1 pod, ordinal 0, with probes) and a worker StatefulSet ``<group>-w`` (N-1 pods,
  ordinals 1..N-1 via ``spec.ordinals.start``, no probes). Two StatefulSets rather than one because a
  StatefulSet has one pod template and non-leader pods must run without probes. The leader's address
  is ``<group>-0.<group>.<namespace>.svc`` in both cases; the rank comes from the controller's pod
  index label. Restarting a whole group when one pod fails is built into LWS; for StatefulSets the
  reconciler deletes the group's pods (label ``nvidia.com/dynamo-group``);
- other component types (planner, ...): a Deployment running the user's command as given; a planner
  also gets a ServiceAccount, Role and RoleBinding allowing it to get and patch only its own graph and
  to create Events (``render.planner``);
- ``spec.pvcs`` entries with ``create: true``: a PersistentVolumeClaim;
- services with ``scalingAdapter: {enabled: true}``: a DynamoGraphDeploymentScalingAdapter, unless a
  planner scales them (``render.scaling``; returned apart, in ``Rendered.adapters``);
- placement (``render.placement``): PodGroups for gangs (v1beta1 ``minAvailable``, multinode groups)
  when a gang scheduler is configured, PodDisruptionBudgets from ``minAvailable``, the pack-domain
  affinity of ``topologyConstraint`` and the graph's ``priorityClassName`` on the pods.

The prefill and decode pods of a disaggregated graph carry the pair's revision (env, label, readiness
gate: ``render.revision``), and the frontend the graph's model names, so that a rollout never pairs
versions and a graph at 0 replicas keeps its models listed.
"""

from __future__ import annotations

from dynamo_api.components import components
from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.validation import validate

from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import notices as _notices
from dynamo_operator.render import placement as _placement
from dynamo_operator.render import planner as _planner
from dynamo_operator.render import scaling as _scaling
from dynamo_operator.render.names import child_name
from dynamo_operator.render.pods import main_container, rdma_settings
from dynamo_operator.render.revision import pair_revision
from dynamo_operator.render.services import render_service
from dynamo_operator.render.types import GroupPlan, Notice, Problem, Rendered, ServicePlan, Workload
from dynamo_operator.render.workloads import persistent_volume_claim

__all__ = ["GroupPlan", "Notice", "Problem", "Rendered", "ServicePlan", "Workload", "render"]


def render(dgd: DynamoGraphDeployment, config: OperatorConfig) -> Rendered:
    """The desired children of ``dgd`` (see the module docstring), or the problems that prevent them."""
    comps = components(dgd)
    problems = validate(dgd) + tuple(_placement.problems(dgd, comps, config))
    if problems:
        return Rendered(problems=problems)
    objects = [persistent_volume_claim(dgd, pvc) for pvc in dgd.spec.pvcs if pvc.create]
    objects += _placement.graph_pod_group(dgd, comps, config)
    objects += _placement.disruption_budgets(dgd, comps)
    notices: list[Notice] = _placement.notices(dgd, comps, config)
    plans: dict[str, ServicePlan] = {}
    rdma = {c.name: rdma_settings(dgd, c, config) for c in comps}
    revision = pair_revision(dgd, config)
    for c in comps:
        container, container_notices = main_container(dgd, c, config, revision)
        output = render_service(dgd, c, config, container, rdma[c.name], revision)
        if _planner.is_planner(c):
            name = child_name(dgd.name, c.name)
            objects += _planner.planner_rbac(dgd, c)
            objects += _planner.with_service_account(output.objects, name, name)
        else:
            objects += output.objects
        plans[c.name] = output.plan
        notices += _notices.ignored_fields(c)
        notices += _notices.unmanaged(c)
        notices += container_notices
        notices += _notices.tp_mismatch(c)
    notices += _notices.transport(dgd, comps, rdma)
    adapters, conflicts = _scaling.scaling_adapters(dgd, comps)
    return Rendered(
        objects=tuple(objects),
        notices=tuple(notices),
        services=plans,
        adapters=adapters,
        scaling_conflicts=conflicts,
    )
