"""The revision of a disaggregated graph's prefill/decode pair: one value on both roles' pods (env
DYN_REVISION, label, readiness gate), a new one when the image or a flag that fixes the KV layout or
the model changes on either side, the same one for other template changes; nothing on aggregated
graphs or the frontend; multinode groups carry it on every member. And the frontend's DYN_GRAPH_MODELS:
the workers' served model names."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from dynamo_api.models import DynamoGraphDeployment
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render
from dynamo_operator.render.revision import PAIRED_CONDITION, REVISION_LABEL

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CONFIG = OperatorConfig(nats_url="nats://nats:4222", worker_image="img/worker:1")


def _example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


def _objects(manifest: dict) -> list[dict]:
    rendered = render(DynamoGraphDeployment.model_validate(manifest), CONFIG)
    assert rendered.problems == ()
    return list(rendered.objects)


def _templates(manifest: dict) -> dict[str, dict]:
    """Pod template of each workload, by service (multinode: the first member's)."""
    out: dict[str, dict] = {}
    for obj in _objects(manifest):
        if obj["kind"] in ("Deployment", "StatefulSet"):
            service = obj["metadata"]["labels"]["nvidia.com/dynamo-component"]
            out.setdefault(service, obj["spec"]["template"])
    return out


def _env(template: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}


def _revision(template: dict) -> str | None:
    env = _env(template).get("DYN_REVISION")
    label = template["metadata"]["labels"].get(REVISION_LABEL)
    gates = template["spec"].get("readinessGates", [])
    assert env == label, "the env var and the label carry the same revision"
    assert (gates == [{"conditionType": PAIRED_CONDITION}]) == (env is not None)
    return env


def _args(manifest: dict, service: str) -> list[str]:
    return manifest["spec"]["services"][service]["extraPodSpec"]["mainContainer"]["args"]


def _set_flag(args: list[str], flag: str, value: str) -> None:
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]


def test_prefill_and_decode_share_one_revision_and_nothing_else_has_one():
    t = _templates(_example("disagg.yaml"))
    prefill, decode = _revision(t["prefill"]), _revision(t["decode"])
    assert prefill is not None and prefill == decode
    assert _revision(t["Frontend"]) is None
    agg = _templates(_example("agg.yaml"))
    assert all(_revision(template) is None for template in agg.values())


def test_a_layout_change_on_either_side_is_a_new_revision_for_both():
    base = _example("disagg.yaml")
    before = _revision(_templates(base)["prefill"])
    for services, flag, value in [
        (("prefill", "decode"), "--page-size", "64"),  # both: the graph is refused otherwise
        (("decode",), "--kv-cache-dtype", "fp8_e5m2"),
        (("prefill",), "--model-path", "Qwen/Qwen3-8B"),
        (("decode",), "--tp", "2"),
    ]:
        changed = copy.deepcopy(base)
        for service in services:
            _set_flag(_args(changed, service), flag, value)
            if flag == "--tp":  # an engine over 2 GPUs needs them (the operator refuses it otherwise)
                changed["spec"]["services"][service]["resources"]["limits"]["gpu"] = value
        t = _templates(changed)
        assert _revision(t["prefill"]) == _revision(t["decode"]) != before, (services, flag)


def test_a_new_image_is_a_new_revision():
    base = _example("disagg.yaml")
    changed = copy.deepcopy(base)
    changed["spec"]["services"]["decode"]["extraPodSpec"]["mainContainer"]["image"] = "img/worker:2"
    assert _revision(_templates(changed)["decode"]) != _revision(_templates(base)["decode"])


def test_other_template_changes_keep_the_revision():
    base = _example("disagg.yaml")
    changed = copy.deepcopy(base)
    changed["spec"]["services"]["decode"]["envs"] = [{"name": "DYN_LOG_LEVEL", "value": "DEBUG"}]
    changed["spec"]["services"]["prefill"]["replicas"] = 3
    assert _revision(_templates(changed)["decode"]) == _revision(_templates(base)["decode"])


def test_every_member_of_a_multinode_group_carries_the_revision():
    manifest = _example("disagg-multinode.yaml")
    revisions = set()
    for obj in _objects(manifest):
        if obj["kind"] == "StatefulSet":
            revisions.add(_revision(obj["spec"]["template"]))
    assert len(revisions) == 1 and None not in revisions


def test_the_frontend_lists_the_graphs_models():
    t = _templates(_example("disagg.yaml"))
    assert _env(t["Frontend"])["DYN_GRAPH_MODELS"] == "Qwen/Qwen3-0.6B"
    assert "DYN_GRAPH_MODELS" not in _env(t["decode"])
