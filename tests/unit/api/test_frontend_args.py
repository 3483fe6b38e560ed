"""dynamo_api.frontend_args.router_mode reads a frontend's command line and env as the frontend itself
does (FrontendSettings: the last --router-mode, else DYN_ROUTER_MODE unless empty, else round-robin),
among the frontend's other flags and NVIDIA Dynamo's it ignores; so the operator wires KV events
exactly where the frontend routes on them."""

from __future__ import annotations

from dynamo_api import contract
from dynamo_api.frontend_args import DEFAULT_ROUTER_MODE, router_mode
from dynamo_api.settings_sources import env_names, flag_names
from dynamo_worker.frontend.settings import FrontendSettings
from hypothesis import given
from hypothesis import strategies as st

MODES = st.sampled_from(["round-robin", "random", "kv"])
# the frontend's own flags and NVIDIA Dynamo's that it ignores, each with a value
OTHERS = st.sampled_from(
    [
        ["--namespace", "ns"],
        ["--http-port", "8000"],
        ["--kv-overlap-score-weight", "2"],
        ["--kv-cache-block-size", "16"],
        ["--router-temperature", "0.5"],
        ["--router-kv-events"],
    ]
)


@st.composite
def command_lines(draw) -> list[str]:
    words: list[str] = []
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            mode = draw(MODES)
            words += draw(st.sampled_from([["--router-mode", mode], [f"--router-mode={mode}"]]))
        else:
            words += draw(OTHERS)
    return words


def test_the_frontend_declares_the_flag_and_variable_read_here():
    assert flag_names(FrontendSettings, "router_mode") == [contract.ROUTER_MODE_FLAG]
    assert env_names(FrontendSettings, "router_mode") == [contract.ENV_ROUTER_MODE]
    assert FrontendSettings.model_fields["router_mode"].default == DEFAULT_ROUTER_MODE


@given(command_lines(), st.sampled_from([None, "", "kv", "random", "round-robin"]))
def test_router_mode_agrees_with_the_frontends_own_parsing(words, variable):
    env = {} if variable is None else {contract.ENV_ROUTER_MODE: variable}
    settings, _ = FrontendSettings.parse_known(words, env)
    assert router_mode(["python3", "-m", "dynamo.frontend", *words], env) == settings.router_mode


def test_an_env_var_from_elsewhere_reads_as_unset():
    """valueFrom (a secret, the downward API) has no value the operator can read: the default then."""
    assert router_mode([], {contract.ENV_ROUTER_MODE: None}) == DEFAULT_ROUTER_MODE
