"""dynamo_worker.local.kubelet: a rendered pod becomes a process the way a kubelet would run it: $(VAR)
expanded with Kubernetes' rules, the downward API answered from the pod, secrets not read, pod DNS names
and ports mapped to this machine, and controllers naming their pods as Kubernetes does."""

from __future__ import annotations

from dynamo_worker.local.kubelet import Pod, expand, localize, pods_of


def pod(container: dict, **kw) -> Pod:
    args = {"name": "g-decode-0", "namespace": "team", "labels": {"rank": "3"}, "annotations": {}}
    args.update(kw)
    return Pod(spec={"containers": [{"name": "main", **container}]}, **args)


def test_var_expansion_follows_kubernetes():
    env = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", env) == "1-two"
    assert expand("$$(A) costs $$5", env) == "$(A) costs $5"  # $$ escapes
    assert expand("$(MISSING) and $(A", env) == "$(MISSING) and $(A"  # unknown or unclosed: as written


def test_env_sees_only_the_entries_before_it_and_command_sees_them_all():
    local = localize(
        pod(
            {
                "command": ["run", "--who", "$(LATER)"],
                "env": [
                    {"name": "EARLY", "value": "x-$(LATER)"},
                    {"name": "LATER", "value": "y"},
                    {"name": "BOTH", "value": "$(EARLY)/$(LATER)"},
                ],
            }
        ),
        {},
        {},
    )
    assert local.env == {"EARLY": "x-$(LATER)", "LATER": "y", "BOTH": "x-$(LATER)/y"}
    assert local.argv == ("run", "--who", "y")


def test_the_downward_api_is_answered_from_the_pod_and_secrets_are_not_read():
    def field(path: str) -> dict:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    local = localize(
        pod(
            {
                "env": [
                    {"name": "NAME", **field("metadata.name")},
                    {"name": "NS", **field("metadata.namespace")},
                    {"name": "IP", **field("status.podIP")},
                    {"name": "RANK", **field("metadata.labels['rank']")},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                ]
            }
        ),
        {},
        {},
    )
    assert local.env == {"NAME": "g-decode-0", "NS": "team", "IP": "127.0.0.1", "RANK": "3"}
    assert local.unread == ("TOKEN",)


def test_a_peer_pods_dns_name_and_port_become_its_local_address():
    peer = "g-w-0-0.g-w-0.team.svc"
    local = localize(
        pod(
            {"args": ["--leader", f"{peer}:29500", "--bind", "0.0.0.0:9090", "--other", "example.com:29500"]}
        ),
        {9090: 41000},
        {peer: {29500: 42000}},
    )
    assert local.argv == (
        "--leader",
        "127.0.0.1:42000",
        "--bind",
        "127.0.0.1:41000",
        "--other",
        "example.com:29500",
    )


def test_controllers_name_pods_and_statefulset_pods_get_their_index_and_dns_name():
    template = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "main"}]}}
    objects = [
        {"kind": "Service", "metadata": {"name": "s", "namespace": "team"}},
        {
            "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "team"},
            "spec": {"replicas": 2, "template": template},
        },
        {
            "kind": "StatefulSet",
            "metadata": {"name": "g-w", "namespace": "team"},
            "spec": {"replicas": 2, "ordinals": {"start": 1}, "serviceName": "g", "template": template},
        },
    ]
    pods = pods_of(objects)
    assert [p.name for p in pods] == ["d-0", "d-1", "g-w-1", "g-w-2"]
    assert pods[0].dns_name is None
    assert pods[3].dns_name == "g-w-2.g.team.svc"
    assert pods[3].labels["apps.kubernetes.io/pod-index"] == "2" and pods[3].labels["app"] == "x"
