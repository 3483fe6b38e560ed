"""The Helm chart renders what users install: it lints and validates (helm lint, kubeconform -strict
against Kubernetes' and our CRD's schemas, hadolint), its values schema refuses bad values with a
message naming the value, RBAC is least-privilege in both scopes, every container is hardened and
pinned, and the operator accepts the configuration the chart gives it (its real settings parser)."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from dynamo_operator.settings import parse_settings

from tests.integration.chart.helm import CHART, find, template, template_error
from tests.support.cluster import REPO, bin_dir

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bins():
    return bin_dir()


def test_lint_script_passes():
    result = subprocess.run(
        ["bash", str(REPO / "hack" / "lint-chart.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[lint-chart] ok" in result.stderr


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (["nats.enabled=false"], "externalAddress"),
        (["operator.replicas=2"], "replicas"),
        (["operator.image.tag=latest"], "tag"),
        (["operator.watch.scope=everywhere"], "scope"),
        (["operator.resourcez.requests.cpu=1"], "resourcez"),
        (["runtime.groupBackend=slurm"], "groupBackend"),
    ],
)
def test_values_schema_refuses_bad_values(bins, values, named):
    assert named in template_error(bins, *values)


def test_cluster_scope_binds_one_cluster_role(bins):
    objs = template(bins)
    assert not find(objs, "Role") and not find(objs, "RoleBinding")
    (role,) = find(objs, "ClusterRole")
    (binding,) = find(objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (sa,) = find(objs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "dynamo"}
    ]
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert {
        "dynamographdeployments",
        "dynamographdeployments/status",
        "dynamographdeploymentscalingadapters",
        "dynamographdeploymentscalingadapters/status",
        "dynamomodels",
        "dynamomodels/status",
        "deployments",
        "statefulsets",
    } <= resources
    assert {"services", "pods", "leaderworkersets", "events", "customresourcedefinitions"} <= resources
    # Least privilege: nothing the operator does not use. It manages namespaced Roles for a graph's
    # planner; Kubernetes lets it grant only what it holds itself, as long as it has no escalate/bind.
    assert not resources & {"secrets", "nodes", "clusterroles", "clusterrolebindings", "*"}
    assert not {v for rule in role["rules"] for v in rule["verbs"]} & {"escalate", "bind", "impersonate"}
    assert all("*" not in rule["verbs"] for rule in role["rules"])
    # server-side apply and merge patches only: no PUT, except where blockOwnerDeletion needs it
    updates = [rule["resources"] for rule in role["rules"] if "update" in rule["verbs"]]
    assert updates == [["dynamographdeployments/finalizers"]]
    (events,) = [rule for rule in role["rules"] if rule["resources"] == ["events"]]
    assert (events["apiGroups"], events["verbs"]) == ([""], ["create"])  # core/v1 Events, posted once
    (pods,) = [rule for rule in role["rules"] if rule["resources"] == ["pods"]]
    assert sorted(pods["verbs"]) == ["delete", "get", "list", "patch", "watch"]  # group restarts


def test_namespace_scope_writes_only_in_the_watched_namespaces(bins):
    objs = template(bins, "operator.watch.scope=namespaces", "operator.watch.namespaces={team-a,team-b}")
    roles = find(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in find(objs, "RoleBinding")) == ["team-a", "team-b"]
    (cluster_role,) = find(objs, "ClusterRole")
    cluster_verbs = {
        v for rule in cluster_role["rules"] if not rule.get("resourceNames") for v in rule["verbs"]
    }
    assert cluster_verbs == {"get", "list", "watch"}  # reads of CRDs and namespaces
    # and two writes, each to one named object: the webhooks' address and CA into the operator's own CRD
    # and into its own ValidatingWebhookConfiguration
    crd_patch, vwc_patch = [rule for rule in cluster_role["rules"] if rule.get("resourceNames")]
    assert crd_patch == {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "resourceNames": ["dynamographdeployments.nvidia.com"],
        "verbs": ["patch"],
    }
    assert vwc_patch == {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["validatingwebhookconfigurations"],
        "resourceNames": ["t-dynamo-operator"],
        "verbs": ["get", "patch"],
    }
    (deployment,) = find(objs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args and "--all-namespaces" not in args
    # the validating webhook sees the watched namespaces only
    (vwc,) = find(objs, "ValidatingWebhookConfiguration")
    (hook,) = vwc["webhooks"]
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a", "team-b"]
    assert (hook["failurePolicy"], hook["clientConfig"]["service"]["path"]) == ("Ignore", "/validate")


def test_namespace_scope_defaults_to_the_release_namespace(bins):
    objs = template(bins, "operator.watch.scope=namespaces", namespace="inference")
    assert [r["metadata"]["namespace"] for r in find(objs, "Role")] == ["inference"]


def test_every_container_is_hardened_and_pinned(bins):
    objs = template(bins, "nats.persistence.enabled=true")
    workloads = find(objs, "Deployment") + find(objs, "StatefulSet")
    assert len(workloads) == 2
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            name, _, tag = container["image"].rpartition(":")
            assert name and tag and tag != "latest", container["image"]
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
            assert "livenessProbe" in container
        labels = workload["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version"):
            assert labels[key]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_operator_liveness_probe_targets_its_healthz(bins):
    (deployment,) = find(template(bins, "operator.healthPort=8181"), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8181} in container["ports"]
    assert "--liveness-port=8181" in container["args"]


def _operator_settings(objs: list[dict]):
    (deployment,) = find(objs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    environ = {e["name"]: e["value"] for e in container["env"]}
    return parse_settings(container["args"], environ)


def test_operator_accepts_the_chart_configuration(bins):
    settings = _operator_settings(
        template(bins, "runtime.rdmaResourceName=example.com/hca", "runtime.groupBackend=lws", namespace="ml")
    )
    assert settings.all_namespaces
    assert settings.nats_url == "nats://t-dynamo-operator-nats.ml.svc:4222"
    assert settings.worker_image == settings.frontend_image == "ghcr.io/dynamo-sglang/dynamo-sglang:0.1.0"
    assert settings.rdma_resource_name == "example.com/hca"
    assert settings.group_backend == "lws"
    assert settings.pod_log_format == "json"
    assert settings.liveness_endpoint == "http://0.0.0.0:8080/healthz"


def test_external_nats_replaces_the_bundled_server(bins):
    objs = template(bins, "nats.enabled=false", "nats.externalAddress=nats://nats.messaging.svc:4222")
    services = [s["metadata"]["name"] for s in find(objs, "Service")]
    assert services == ["t-dynamo-operator-webhook"]  # the conversion webhook's only: no NATS Service
    assert not find(objs, "StatefulSet") and not find(objs, "ConfigMap")
    assert _operator_settings(objs).nats_url == "nats://nats.messaging.svc:4222"


def test_bundled_nats_runs_jetstream_behind_its_service(bins):
    objs = template(bins)
    (sts,) = find(objs, "StatefulSet")
    (config,) = find(objs, "ConfigMap")
    assert "jetstream {" in config["data"]["nats.conf"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("nats:")
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz?js-enabled-only=true"
    services = {s["metadata"]["name"]: s for s in find(objs, "Service")}
    assert sts["spec"]["serviceName"] in services
    assert services[sts["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    assert "t-dynamo-operator-nats" in services


def test_chart_crd_is_the_generated_crd():
    chart_copy = CHART / "crds" / "nvidia.com_dynamographdeployments.yaml"
    generated = REPO / "crds" / "nvidia.com_dynamographdeployments.yaml"
    assert chart_copy.read_text() == generated.read_text(), (
        "charts/dynamo-operator/crds/ is stale: run `python -m dynamo_api.crdgen`"
    )


def test_conversion_webhook_service_port_and_flags(bins):
    """The Service the operator writes into the CRD reaches the operator's webhook port; with a cert
    Secret, the operator reads its certificate from it instead of generating one."""
    objs = template(bins, "operator.webhook.certSecret=webhook-tls")
    (service,) = [s for s in find(objs, "Service") if s["metadata"]["name"].endswith("-webhook")]
    (deployment,) = find(objs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert service["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert {"name": "webhook", "containerPort": 9443} in container["ports"]
    settings = _operator_settings(objs)
    assert settings.webhook_port == 9443
    assert settings.webhook_client_config() == {
        "service": {
            "namespace": "dynamo",
            "name": service["metadata"]["name"],
            "path": "/convert",
            "port": 443,
        }
    }
    assert str(settings.webhook_cert_dir) == "/etc/dynamo-operator/webhook"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "webhook-cert"]
    assert volume["secret"]["secretName"] == "webhook-tls"


def test_frontend_api_key_secret_reaches_every_frontend_pod(bins):
    """frontend.apiKey -> the operator's settings -> DYN_API_KEY from a secretKeyRef on frontend pods."""
    from dynamo_api.conversion import load_graph
    from dynamo_operator.render import render

    assert _operator_settings(template(bins)).frontend_api_key_secret is None
    settings = _operator_settings(
        template(bins, "frontend.apiKey.existingSecret=frontend-api-key", "frontend.apiKey.key=token")
    )
    config = settings.operator_config("statefulset")
    graph = {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "g", "namespace": "ml", "uid": "u-1"},
        "spec": {"services": {"Frontend": {"componentType": "frontend"}}},
    }
    (deployment,) = [o for o in render(load_graph(graph), config).objects if o["kind"] == "Deployment"]
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    ref = {"secretKeyRef": {"name": "frontend-api-key", "key": "token"}}
    assert [e for e in env if e["name"] == "DYN_API_KEY"] == [{"name": "DYN_API_KEY", "valueFrom": ref}]
    assert "existingSecret" in template_error(bins, "frontend.apiKey.existingSecret=Not_A_Name")


def test_inference_extension_crd_is_installed_only_when_asked_and_as_vendored(bins):
    """inferenceExtension.installCRD installs GAIE's InferencePool CRD as vendored (its spec unchanged),
    kept on uninstall; the operator may manage InferencePools either way."""
    name = "inferencepools.inference.networking.k8s.io"
    assert not find(template(bins), "CustomResourceDefinition", name)
    (crd,) = find(template(bins, "inferenceExtension.installCRD=true"), "CustomResourceDefinition", name)
    vendored = yaml.safe_load(
        (CHART / "files" / "inference.networking.k8s.io_inferencepools.yaml").read_text()
    )
    assert crd["spec"] == vendored["spec"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1"]
    (role,) = find(template(bins), "ClusterRole")
    rule = next(r for r in role["rules"] if r["apiGroups"] == ["inference.networking.k8s.io"])
    assert rule["resources"] == ["inferencepools"] and {"create", "patch", "delete", "list"} <= set(
        rule["verbs"]
    )
