"""The errors of a Kubernetes API call: one tree for the one client (``dynamo_clients.kube``), as the
operator (``dynamo_operator.reconcile.kube``) and the planner (``dynamo_worker.planner.kube``) use it::

    KubeError            a call failed; .status (the HTTP status, 0 when no answer came), .reason, .message
    ├── NotFound         404
    ├── Conflict         409
    └── Invalid          422 (the object was rejected by validation or admission)

The operator's client raises ``aiohttp.ClientError`` or ``TimeoutError`` for a connection that fails
(its work queue retries those); the planner's wraps them in a ``KubeError`` with status 0.
"""

from __future__ import annotations

from dynamo_api.errors import DynamoError

__all__ = ["Conflict", "Invalid", "KubeError", "NotFound", "kube_error"]


class KubeError(DynamoError):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class Invalid(KubeError):
    pass


_BY_STATUS: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 422: Invalid}


def kube_error(status: int, reason: str, message: str) -> KubeError:
    """The error of the tree that an answer with ``status`` is."""
    return _BY_STATUS.get(status, KubeError)(status, reason, message)
