"""The test environment is real: a Deployment asking for GPUs becomes Ready on a kwok node of the local
control plane (apiserver + etcd + controller-manager + scheduler + kwok), and a JetStream KV key
round-trips through the real nats-server."""

from __future__ import annotations

import nats
from kubernetes_asyncio import client

from tests.support.cluster import GPU_NODES
from tests.support.wait import wait_until_async


async def test_gpu_deployment_becomes_ready_on_a_kwok_node(k8s_api, k8s_namespace):
    apps = client.AppsV1Api(k8s_api)
    container = client.V1Container(
        name="main",
        image="registry.invalid/never-pulled:1",
        resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "2"}),
    )
    deployment = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="gpu-smoke"),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels={"app": "gpu-smoke"}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "gpu-smoke"}),
                spec=client.V1PodSpec(containers=[container]),
            ),
        ),
    )
    await apps.create_namespaced_deployment(k8s_namespace, deployment)

    seen: list[client.V1DeploymentStatus] = []

    async def two_ready() -> bool:
        seen.append((await apps.read_namespaced_deployment_status("gpu-smoke", k8s_namespace)).status)
        return seen[-1].ready_replicas == 2

    await wait_until_async(
        two_ready,
        "the Deployment's 2 replicas to be Ready",
        timeout_s=60,
        interval_s=0.2,
        explain=lambda: str(seen[-1] if seen else None),
    )

    listed = await client.CoreV1Api(k8s_api).list_namespaced_pod(
        k8s_namespace, label_selector="app=gpu-smoke"
    )
    pods = listed.items
    assert len(pods) == 2
    for pod in pods:
        assert pod.spec.node_name in GPU_NODES
        assert pod.status.phase == "Running"
        assert pod.status.pod_ip


async def test_pod_asking_for_more_gpus_than_a_node_has_stays_pending(k8s_api, k8s_namespace):
    """The fake nodes really account for nvidia.com/gpu: 9 GPUs fit on no 8-GPU node."""
    core = client.CoreV1Api(k8s_api)
    await core.create_namespaced_pod(
        k8s_namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="too-big"),
            spec=client.V1PodSpec(
                containers=[
                    client.V1Container(
                        name="main",
                        image="registry.invalid/never-pulled:1",
                        resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "9"}),
                    )
                ]
            ),
        ),
    )

    async def failed_scheduling() -> bool:
        events = await core.list_namespaced_event(k8s_namespace, field_selector="involvedObject.name=too-big")
        return any(e.reason == "FailedScheduling" and "nvidia.com/gpu" in e.message for e in events.items)

    await wait_until_async(
        failed_scheduling, "a FailedScheduling event naming nvidia.com/gpu", timeout_s=30, interval_s=0.2
    )
    assert (await core.read_namespaced_pod("too-big", k8s_namespace)).status.phase == "Pending"


async def test_jetstream_kv_round_trip(nats_url):
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket="smoke-test")
        await kv.put("instance.1", b'{"hello": "world"}')
        entry = await kv.get("instance.1")
        assert entry.value == b'{"hello": "world"}'
        await js.delete_key_value("smoke-test")
    finally:
        await nc.close()
