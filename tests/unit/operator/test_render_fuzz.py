"""Bad specs are answered, never crashed on: render, fed arbitrary schema-valid graphs (hypothesis),
returns either problems and no objects, or objects with valid names and labels, deterministically."""

from __future__ import annotations

import json

from dynamo_api.models import DynamoGraphDeployment
from dynamo_api.validation import is_dns_label
from dynamo_operator.config import OperatorConfig
from dynamo_operator.render import render
from hypothesis import event, given, settings
from hypothesis import strategies as st

FLAGS = st.sampled_from(
    [
        ["--tp", "2"],
        ["--tp-size", "x"],
        ["--page-size", "16"],
        ["--page-size", "32"],
        ["--disaggregation-mode", "prefill"],
        ["--disaggregation-mode", "decode"],
        ["--disaggregation-transfer-backend", "nixl"],
        ["--disaggregation-bootstrap-port", "99999"],
        ["--host", "127.0.0.1"],
        ["--dp-size", "2", "--enable-dp-attention"],
    ]
)


@st.composite
def services(draw):
    args = [token for flags in draw(st.lists(FLAGS, max_size=4)) for token in flags]
    command = draw(st.sampled_from([None, ["python3", "-m", "dynamo.sglang"], ["sh", "-c"]]))
    container: dict = {
        "args": [" ".join(["python3 -m dynamo.sglang", *args])] if command == ["sh", "-c"] else args
    }
    if command:
        container["command"] = command
    service: dict = {
        "componentType": draw(
            st.sampled_from([None, "frontend", "planner", "worker", "worker", "worker", "prefill", "decode"])
        ),
        "replicas": draw(st.integers(0, 3)),
        "extraPodSpec": {"mainContainer": container},
    }
    if draw(st.booleans()):
        service["multinode"] = {"nodeCount": draw(st.integers(2, 3))}
    gpu = draw(st.sampled_from([None, "0", "x", 2, "1", "1", "4", "4", "4"]))
    if gpu is not None:
        service["resources"] = {"limits": {"gpu": gpu}}
    if draw(st.integers(0, 3)) == 0:
        service["subComponentType"] = draw(st.sampled_from(["prefill", "decode"]))
    if draw(st.integers(0, 3)) == 0:
        service["annotations"] = {"nvidia.com/rdma": draw(st.sampled_from(["true", "false", "maybe"]))}
    return service


graphs = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {
                "name": st.one_of(
                    st.from_regex(r"[a-z]([-a-z0-9]{0,70}[a-z0-9])?", fullmatch=True),
                    st.from_regex(r"[a-z0-9][-a-z0-9.]{0,70}", fullmatch=True),
                ),
                "uid": st.just("u"),
            }
        ),
        "spec": st.fixed_dictionaries(
            {
                "services": st.dictionaries(
                    st.from_regex(r"[A-Za-z][-A-Za-z0-9_]{0,12}", fullmatch=True), services(), max_size=4
                ).map(lambda s: {"Frontend": {"componentType": "frontend"}, **s}),
                "backendFramework": st.sampled_from(["sglang", "sglang", "sglang", "vllm"]),
            }
        ),
    }
)


@settings(max_examples=150, deadline=None)
@given(graphs, st.sampled_from(["lws", "statefulset"]))
def test_render_answers_every_graph(body, backend):
    dgd = DynamoGraphDeployment.model_validate(body)
    config = OperatorConfig(group_backend=backend)
    rendered = render(dgd, config)
    event("problems" if rendered.problems else "objects")
    if rendered.problems:
        assert rendered.objects == ()
        return
    assert set(rendered.services) == set(dgd.spec.services)
    for obj in rendered.objects:
        name = obj["metadata"]["name"]
        assert is_dns_label(name) and len(name) <= 52, name
        assert all(len(v) <= 63 for v in obj["metadata"]["labels"].values())
    assert json.dumps(render(dgd, config).objects) == json.dumps(rendered.objects)
