"""The base both packages stand on: pure, importing neither ``dynamo_operator`` nor ``dynamo_worker``.

The manifest: ``models`` (the DynamoGraphDeployment CRD at v1alpha1, also the one internal model
``render`` works from), ``v1beta1`` (the stored version), ``scaling`` (the scaling adapter's CRD),
``conversion`` (both ways, and ``load_graph``: a raw manifest of either version -> the internal model),
``crdgen`` (the CRD YAML of ``crds/``, generated from those models) and ``validation``
(``validate(dgd) -> tuple[Problem, ...]``, the one judge of a graph for the operator and dynamo-run)
with its helpers ``components`` and ``annotations``. What the pods and both packages share:
``contract`` (the pod contract: env, ports, flags), ``modules`` (the engine-swap table: which module runs
which role, NVIDIA Dynamo's names for them), ``sglang_args`` (SGLang's flag facts, read off a container),
``frontend_args`` (the frontend's router mode, read off a container as the frontend reads it) and
``settings_sources`` (the settings base: flags and env vars into typed models).
"""
