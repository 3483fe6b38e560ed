"""``dynamo-run``: serve a DynamoGraphDeployment manifest on one machine as local processes.

Modules: ``settings`` (the CLI), ``manifest`` (read the YAML with the operator's api models),
``engine`` (SGLang or the mocker, and why), ``commands`` and ``plan`` (pure: which processes, with
which env, ports and GPUs), ``supervisor`` (process groups, logs, readiness, stop), ``run`` (the
main sequence).
"""
