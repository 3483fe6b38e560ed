"""The fault suite (``make faults``): each test breaks one thing on purpose, asserts a clear answer
within the bound it promises users, and records one row of the table printed at the end:

    fault | what was done | bound | observed (time to a clear answer) | requests lost

``fault_row(name, done, bound_s)`` (a fixture of ``tests/support/faults_table.py``) returns a
``Row``; the test times the clear answer with
``row.answered(seconds)`` (or ``with row.timing(): ...``), counts ``row.lost``, and asserts
``row.within_bound()``. The table is printed (and written as JSON to ``$FAULTS_TABLE``) by
``tests/support/faults_table.py``, whole under pytest-xdist too. Real parts throughout: nats-server, mocker
worker processes, the frontend, the operator and the local kube-apiserver, with the fixtures of the
integration tier (imported below).
"""

from __future__ import annotations

from tests.integration.frontend.conftest import (  # noqa: F401 - fixtures, registered by import
    frontend_factory,
    mockers,
    namespace,
    tiny_model,
    wait_warm,
    wait_workers,
)
from tests.integration.operator.conftest import (  # noqa: F401 - fixtures, registered by import
    dgd_crd,
    kc,
    operator,
    operator_factory,
)
