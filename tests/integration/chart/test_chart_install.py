"""`helm install` of the chart into the real local control plane, then the operator run as a local
process with the chart's own ServiceAccount (a token from the TokenRequest API: RBAC is enforced, so
the chart's least-privilege rules are proven sufficient) and the chart's operator configuration;
examples/disagg.yaml reaches Ready (kwok plays the pods), its pods get the chart's NATS address, and
`helm uninstall` leaves nothing of the release behind but the CRD.

The operator Deployment is installed with 0 replicas because no image registry is reachable here."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from tests.integration.chart.helm import CHART, find, helm
from tests.integration.operator.conftest import OperatorProcess, too_wide_disagg, wait_until
from tests.support.cluster import REPO, LocalCluster

pytestmark = pytest.mark.integration

CRD = "dynamographdeployments.nvidia.com"
ENV_PREFIX = "DYN_OPERATOR_"
# Flags the test's OperatorProcess sets itself (its own scope and a free liveness port).
# The test's operator runs on this machine: its own scope and ports, and its webhook at a 127.0.0.1 URL
# instead of the chart's Service (which no kube-proxy serves here).
OWN_FLAGS = ("--namespace", "--all-namespaces", "--liveness-port", "--webhook-port", "--webhook-service")


def token_kubeconfig(cluster: LocalCluster, namespace: str, service_account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as ``service_account`` (TokenRequest API, 1 hour)."""
    token = cluster.kubectl("create", "token", service_account, "-n", namespace, "--duration=1h").strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [
            {"name": "sa", "context": {"cluster": admin["clusters"][0]["name"], "user": service_account}}
        ],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def operator_flags(deployment: dict) -> list[str]:
    """The chart's operator configuration (args + DYN_OPERATOR_* env) as command-line flags."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    flags = [a for a in container["args"] if not a.startswith(OWN_FLAGS)]
    for env in container["env"]:
        if env["name"].startswith(ENV_PREFIX):
            flags.append(f"--{env['name'][len(ENV_PREFIX) :].lower().replace('_', '-')}={env['value']}")
    return flags


def release_leftovers(cluster: LocalCluster, namespace: str, release: str) -> list[str]:
    selector = f"app.kubernetes.io/instance={release}"
    kinds = "all,configmaps,serviceaccounts,roles,rolebindings,persistentvolumeclaims"
    names = cluster.kubectl("get", kinds, "-n", namespace, "-l", selector, "-o", "name").split()
    cluster_kinds = "clusterroles,clusterrolebindings,validatingwebhookconfigurations"
    names += cluster.kubectl("get", cluster_kinds, "-l", selector, "-o", "name").split()
    return names


def test_install_serve_disagg_and_uninstall(kube_cluster: LocalCluster, k8s_namespace: str, tmp_path: Path):
    ns = k8s_namespace
    release = f"dyn-{uuid.uuid4().hex[:6]}"
    env = kube_cluster.env()
    bins = kube_cluster.bin_dir
    install = helm(
        bins, "install", release, str(CHART), "--namespace", ns, "--wait", "--timeout", "120s",
        "--set", "operator.replicas=0", "--set", "operator.watch.scope=namespaces",
        env=env,
    )  # fmt: skip
    assert "kubectl apply -n" in install.stdout and "examples/disagg.yaml" in install.stdout  # NOTES.txt
    uninstalled = False
    op: OperatorProcess | None = None
    try:
        kube_cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
        manifests = [
            d
            for d in yaml.safe_load_all(helm(bins, "get", "manifest", release, "-n", ns, env=env).stdout)
            if d
        ]
        (deployment,) = find(manifests, "Deployment")
        (service_account,) = find(manifests, "ServiceAccount")
        sa = service_account["metadata"]["name"]
        (nats_statefulset,) = find(manifests, "StatefulSet")
        nats_name = nats_statefulset["metadata"]["name"]
        kube_cluster.kubectl("rollout", "status", f"statefulset/{nats_name}", "-n", ns, "--timeout=60s")

        # Least privilege, seen by the API server: what the operator needs, and not more.
        who = f"--as=system:serviceaccount:{ns}:{sa}"
        can = lambda *a: kube_cluster.kubectl("auth", "can-i", *a, who, check=False).strip()  # noqa: E731
        assert can("patch", "dynamographdeployments.nvidia.com", "--subresource=status", "-n", ns) == "yes"
        # Patch on graphs: the operator writes a scaling adapter's replicas into its service, and grants a
        # graph's planner patch on that one graph (Kubernetes lets a Role grant only what its creator
        # holds). It may create Roles but not escalate or bind beyond what it holds.
        assert can("patch", "dynamographdeployments.nvidia.com", "-n", ns) == "yes"
        adapters = "dynamographdeploymentscalingadapters.nvidia.com"
        for verb in ("create", "list", "watch", "patch", "delete"):
            assert can(verb, adapters, "-n", ns) == "yes", verb
        assert can("patch", adapters, "--subresource=status", "-n", ns) == "yes"
        # DynamoModels: watched, a finalizer added and removed (patch), status written; never created
        models = "dynamomodels.nvidia.com"
        for verb in ("list", "watch", "patch"):
            assert can(verb, models, "-n", ns) == "yes", verb
        assert can("patch", models, "--subresource=status", "-n", ns) == "yes"
        assert can("create", models, "-n", ns) == "no"
        assert can("escalate", "roles.rbac.authorization.k8s.io", "-n", ns) == "no"
        assert can("bind", "roles.rbac.authorization.k8s.io", "-n", ns) == "no"
        assert can("delete", "pods", "-n", ns) == "yes"
        assert can("patch", "pods", "-n", ns) == "yes"  # group restarts mark the pods they delete
        assert can("list", "secrets", "-n", ns) == "no"
        assert can("create", "deployments", "-n", "default") == "no"
        # the conversion webhook: the operator writes its Service and CA into its own CRD, no other
        assert can("patch", f"customresourcedefinitions.apiextensions.k8s.io/{CRD}") == "yes"
        assert can("patch", "customresourcedefinitions.apiextensions.k8s.io/other.example.com") == "no"
        # the validating webhook: the chart installs its configuration, the operator keeps it pointed
        vwc = f"validatingwebhookconfigurations.admissionregistration.k8s.io/{release}-dynamo-operator"
        assert can("patch", vwc) == "yes"
        assert can("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io/other") == "no"

        kubeconfig = token_kubeconfig(kube_cluster, ns, sa, tmp_path / "operator-kubeconfig")
        op = OperatorProcess(
            kubeconfig, ns, tmp_path / "operator.log", tuple(operator_flags(deployment)), cluster=kube_cluster
        ).start()

        # The chart's validating webhook, pointed at this operator: a graph that cannot run is refused.
        broken = too_wide_disagg("too-wide")
        refused = subprocess.run(
            [str(bins / "kubectl"), "apply", "-n", ns, "-f", "-"],
            input=json.dumps(broken), capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert refused.returncode != 0
        assert 'admission webhook "validate.dynamographdeployments.nvidia.com" denied' in refused.stderr
        assert "spec.services.decode.extraPodSpec.mainContainer.args" in refused.stderr

        kube_cluster.kubectl("apply", "-n", ns, "-f", str(REPO / "examples" / "disagg.yaml"))
        kube_cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "dgd/sglang-disagg", "--timeout=120s")

        nats_address = f"nats://{release}-dynamo-operator-nats.{ns}.svc:4222"
        deployments = json.loads(kube_cluster.kubectl("get", "deployments", "-n", ns, "-o", "json"))["items"]
        graph = [d for d in deployments if d["metadata"]["name"].startswith("sglang-disagg-")]
        assert graph, "the operator created no Deployments for sglang-disagg"
        for child in graph:
            main = child["spec"]["template"]["spec"]["containers"][0]
            assert {"name": "NATS_SERVER", "value": nats_address} in main["env"], child["metadata"]["name"]

        # A scaling adapter, with the chart's RBAC: created, its status written, its replicas copied.
        kube_cluster.kubectl(
            "patch", "-n", ns, "dynamographdeployments.v1alpha1.nvidia.com", "sglang-disagg", "--type=merge",
            "-p", json.dumps({"spec": {"services": {"decode": {"scalingAdapter": {"enabled": True}}}}}),
        )  # fmt: skip
        wait_until(
            lambda: kube_cluster.kubectl(
                "get", "dgdsa", "-n", ns, "sglang-disagg-decode", "--ignore-not-found", "-o", "name"
            ).strip(),
            "the decode service's scaling adapter",
        )
        kube_cluster.kubectl("scale", "dgdsa", "-n", ns, "sglang-disagg-decode", "--replicas=2")
        wait_until(
            lambda: (
                json.loads(
                    kube_cluster.kubectl("get", "deployment", "-n", ns, "sglang-disagg-decode", "-o", "json")
                )["spec"]["replicas"]
                == 2
            ),
            "decode's Deployment scaled to 2 through the adapter",
        )

        # A graph with a planner: the operator, with the chart's RBAC, may grant it its own Role.
        kube_cluster.kubectl("apply", "-n", ns, "-f", str(REPO / "examples" / "disagg-planner.yaml"))
        kube_cluster.kubectl(
            "wait", "-n", ns, "--for=condition=Ready", "dgd/sglang-disagg-planner", "--timeout=120s"
        )
        role = json.loads(
            kube_cluster.kubectl("get", "role", "-n", ns, "sglang-disagg-planner-planner", "-o", "json")
        )
        assert role["rules"][0]["resourceNames"] == ["sglang-disagg-planner"]

        kube_cluster.kubectl(
            "delete", "-n", ns, "dgd/sglang-disagg", "dgd/sglang-disagg-planner", "--timeout=60s"
        )
        op.stop()
        log = (tmp_path / "operator.log").read_text()
        op = None
        # kopf degrades quietly without a permission (a warning, not an error): none may be missing.
        for sign in ("Not enough permissions", "Forbidden", "forbidden"):
            assert sign not in log, f"the chart's RBAC lacks a permission the operator uses:\n{log}"

        helm(bins, "uninstall", release, "--namespace", ns, "--wait", "--timeout", "120s", env=env)
        uninstalled = True
        wait_until(
            lambda: not release_leftovers(kube_cluster, ns, release), "the release's objects to be gone"
        )
        # The CRD stays on purpose (README.md, "Upgrading the CRD").
        assert (
            kube_cluster.kubectl("get", "crd", CRD, "-o", "name").strip()
            == f"customresourcedefinition.apiextensions.k8s.io/{CRD}"
        )
    finally:
        if op is not None:
            print(op.log_tail())
            op.stop()
        if not uninstalled:
            helm(bins, "uninstall", release, "--namespace", ns, env=env, check=False)
