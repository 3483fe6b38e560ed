"""The operator's public, pure layer, shared with ``dynamo_worker`` (dynamo-run reads manifests with it).

``models`` (the DynamoGraphDeployment CRD at v1alpha1, also the one internal model ``render`` works from),
``v1beta1`` (the stored version), ``conversion`` (both ways, and ``load_graph``: a raw manifest of either
version -> the internal model), ``contract`` (the worker launch contract), ``validation``
(``validate(dgd) -> tuple[Problem, ...]``, the one judge of a graph for the operator and dynamo-run)
with its helpers ``components``, ``sglang_args`` and ``annotations``.
"""
