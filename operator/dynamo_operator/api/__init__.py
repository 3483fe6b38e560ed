"""The operator's public, pure layer, shared with ``dynamo_worker`` (dynamo-run reads manifests with it).

``models`` (the DynamoGraphDeployment CRD), ``contract`` (the worker launch contract), ``validation``
(``validate(dgd) -> tuple[Problem, ...]``, the one judge of a graph for the operator and dynamo-run)
with its helpers ``components``, ``sglang_args`` and ``annotations``.
"""
