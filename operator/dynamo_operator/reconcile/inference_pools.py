"""A graph's InferencePool where GAIE's CRD is installed; where it is not, the graph without it and a
warning naming the fix (``render.endpoint_picker.without_pools``).

Asked on each visit of a graph that has an endpoint picker (one GET of the CRD), so that installing the
CRD later is taken up by the next visit, without restarting the operator.
"""

from __future__ import annotations

from dynamo_operator.reconcile.kube import Kube
from dynamo_operator.render.endpoint_picker import INFERENCE_POOL_CRD, wants_pool, without_pools
from dynamo_operator.render.types import Rendered

__all__ = ["where_installed"]


async def where_installed(kube: Kube, rendered: Rendered) -> Rendered:
    if not wants_pool(rendered) or await kube.crd_established(INFERENCE_POOL_CRD):
        return rendered
    return without_pools(rendered)
