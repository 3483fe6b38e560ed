{{/*
Names, labels and shared RBAC rules. Every resource of the chart uses these helpers, so names and
labels are the same everywhere.
*/}}

{{- define "dynamo-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-qualified name: <release>-dynamo-operator, or the release name when it already contains it. */}}
{{- define "dynamo-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dynamo-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every resource. Call with (dict "ctx" $ "component" "operator"). */}}
{{- define "dynamo-operator.labels" -}}
helm.sh/chart: {{ include "dynamo-operator.chart" .ctx }}
{{ include "dynamo-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: dynamo-sglang
{{- end }}

{{/* The immutable subset used in selectors. Call with (dict "ctx" $ "component" "operator"). */}}
{{- define "dynamo-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dynamo-operator.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "dynamo-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dynamo-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "dynamo-operator.natsName" -}}
{{- printf "%s-nats" (include "dynamo-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The NATS address the operator writes onto every pod of a graph. */}}
{{- define "dynamo-operator.natsAddress" -}}
{{- if .Values.nats.enabled }}
{{- printf "nats://%s.%s.svc:%d" (include "dynamo-operator.natsName" .) .Release.Namespace (int .Values.nats.service.port) }}
{{- else }}
{{- required "nats.externalAddress is required when nats.enabled=false (e.g. nats://nats.nats.svc:4222)" .Values.nats.externalAddress }}
{{- end }}
{{- end }}

{{- define "dynamo-operator.image" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) }}
{{- end }}

{{- define "dynamo-operator.runtimeImage" -}}
{{- printf "%s:%s" .Values.runtime.image.repository (default .Chart.AppVersion .Values.runtime.image.tag) }}
{{- end }}

{{/* The namespaces the operator watches in "namespaces" scope (default: the release namespace). */}}
{{- define "dynamo-operator.watchNamespaces" -}}
{{- if .Values.operator.watch.namespaces }}
{{- .Values.operator.watch.namespaces | uniq | join "," }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{/*
Namespaced permissions: exactly the verbs and resources the operator uses. Shared by the ClusterRole
(scope=cluster) and the per-namespace Roles (scope=namespaces).
*/}}
{{- define "dynamo-operator.namespacedRules" -}}
# The custom resource: watched only (the operator uses kopf event handlers, which write no progress
# annotations or finalizers on it); status is written through the subresource.
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments"]
  verbs: ["get", "list", "watch"]
# patch: the operator copies a scaling adapter's spec.replicas into its service (the only spec field it
# writes), and a graph's planner gets a Role allowing get and patch on that graph only (Kubernetes lets
# the operator grant only what it holds itself).
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments"]
  verbs: ["patch"]
# One DynamoGraphDeploymentScalingAdapter per service that opts in: created, relabelled, pruned, and its
# status written. HPA, KEDA and kubectl scale its spec.replicas through /scale.
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeploymentscalingadapters"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeploymentscalingadapters/status"]
  verbs: ["get", "patch"]
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments/status"]
  verbs: ["get", "patch"]
# DynamoModels (LoRA adapters): watched; a LoRA model gets the operator's finalizer (patch), so that
# deleting it unloads the adapter from the workers first; status written through the subresource.
- apiGroups: ["nvidia.com"]
  resources: ["dynamomodels"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["nvidia.com"]
  resources: ["dynamomodels/status"]
  verbs: ["get", "patch"]
# Children carry ownerReferences with blockOwnerDeletion, which needs update on the owner's finalizers
# where the OwnerReferencesPermissionEnforcement admission plugin is on.
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments/finalizers"]
  verbs: ["update"]
# Rendered children: created and converged by server-side apply (create + patch), pruned (delete).
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Services of the graph, and PersistentVolumeClaims from spec.pvcs.
- apiGroups: [""]
  resources: ["services", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Pods are observed, and to restart a whole multinode group they are marked (an annotation, patch)
# and deleted.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# A disaggregated graph's prefill and decode pods are Ready once their revision has both roles, and a
# LoRA worker once it holds its adapters: the operator states that in their readiness gate conditions
# (render.revision, render.lora_gate).
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
# minAvailable: a PodDisruptionBudget per service, and with scheduler-plugins installed the PodGroups of
# the graph's gangs (render.placement).
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# A graph with an endpoint picker: its InferencePool (the Gateway API Inference Extension's; listed, and
# so pruned, only where its CRD is installed: render.endpoint_picker).
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# A planner component's ServiceAccount, Role and RoleBinding (render.planner).
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Kubernetes Events (core/v1, each posted once) for every decision and error.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/*
Cluster-scoped reads every mode needs: kopf scans and watches CRDs (and the operator detects the
LeaderWorkerSet CRD); with a list of namespaces kopf also watches namespaces to follow them appearing.
*/}}
{{- define "dynamo-operator.clusterReadRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/*
The operator's command-line flags: watch scope, liveness endpoint and conversion webhook (see
`dynamo-operator --help`).
*/}}
{{- define "dynamo-operator.args" -}}
{{- if eq .Values.operator.watch.scope "cluster" }}
- --all-namespaces
{{- else }}
{{- range splitList "," (include "dynamo-operator.watchNamespaces" .) }}
- --namespace={{ . }}
{{- end }}
{{- end }}
- --liveness-port={{ .Values.operator.healthPort }}
- --webhook-port={{ .Values.operator.webhook.port }}
- --webhook-service={{ .Release.Namespace }}/{{ include "dynamo-operator.webhookName" . }}:{{ .Values.operator.webhook.servicePort }}
{{- if .Values.operator.webhook.certSecret }}
- --webhook-cert-dir=/etc/dynamo-operator/webhook
{{- end }}
- --validating-webhook={{ include "dynamo-operator.fullname" . }}
- --webhook-failure-policy={{ .Values.operator.webhook.failurePolicy }}
{{- end }}

{{/*
The Service in front of the conversion webhook.
*/}}
{{- define "dynamo-operator.webhookName" -}}
{{ include "dynamo-operator.fullname" . | trunc 55 | trimSuffix "-" }}-webhook
{{- end }}

{{/*
The operator's configuration, as the environment variables dynamo_operator.settings reads.
*/}}
{{- define "dynamo-operator.env" -}}
- name: DYN_OPERATOR_NATS_URL
  value: {{ include "dynamo-operator.natsAddress" . | quote }}
- name: DYN_OPERATOR_FRONTEND_IMAGE
  value: {{ include "dynamo-operator.runtimeImage" . | quote }}
- name: DYN_OPERATOR_WORKER_IMAGE
  value: {{ include "dynamo-operator.runtimeImage" . | quote }}
- name: DYN_OPERATOR_IMAGE_PULL_POLICY
  value: {{ .Values.runtime.image.pullPolicy | quote }}
- name: DYN_OPERATOR_RDMA_RESOURCE_NAME
  value: {{ .Values.runtime.rdmaResourceName | quote }}
- name: DYN_OPERATOR_GROUP_BACKEND
  value: {{ .Values.runtime.groupBackend | quote }}
- name: DYN_OPERATOR_GANG_SCHEDULER
  value: {{ .Values.runtime.gangScheduler | quote }}
- name: DYN_OPERATOR_GANG_SCHEDULER_NAME
  value: {{ .Values.runtime.gangSchedulerName | quote }}
- name: DYN_OPERATOR_TOPOLOGY_DOMAINS
  value: {{ .Values.runtime.topologyDomains | toJson | quote }}
- name: DYN_OPERATOR_POD_LOG_FORMAT
  value: {{ .Values.runtime.logFormat | quote }}
{{- with .Values.frontend.apiKey.existingSecret }}
- name: DYN_OPERATOR_FRONTEND_API_KEY_SECRET
  value: {{ . | quote }}
- name: DYN_OPERATOR_FRONTEND_API_KEY_SECRET_KEY
  value: {{ $.Values.frontend.apiKey.key | quote }}
{{- end }}
- name: DYN_OPERATOR_LOG_LEVEL
  value: {{ .Values.operator.logLevel | quote }}
- name: DYN_OPERATOR_LOG_FORMAT
  value: {{ .Values.operator.logFormat | quote }}
{{- end }}
