"""``dynamo-run``: serve a DynamoGraphDeployment manifest on one machine as local processes.

Modules: ``settings`` (the CLI), ``manifest`` (read the YAML with dynamo_api's manifest models),
``engine_choice`` (SGLang or the mocker, and why), ``plan`` (pure: the operator's ``render()``, which pods
run, with which ports and GPUs), ``kubelet`` (pure: a rendered pod as a process, substituting what a
cluster gives a pod), ``supervisor`` (process groups, logs, readiness, stop), ``run`` (the
main sequence).
"""
