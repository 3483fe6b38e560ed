"""Planner integration tests use the operator fixtures (real apiserver, operator subprocess) and the
frontend fixtures (nats-server, mocker worker processes, in-process frontend) together."""

from tests.integration.frontend.conftest import (  # noqa: F401 - fixtures
    frontend_factory,
    mockers,
    namespace,
    tiny_model,
    wait_workers,
)
from tests.integration.operator.conftest import (  # noqa: F401 - fixtures
    dgd_crd,
    kc,
    operator,
    operator_factory,
)
