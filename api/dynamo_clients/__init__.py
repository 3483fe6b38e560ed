"""The I/O both packages share, on the pure base ``dynamo_api``: ``kube`` (the Kubernetes client of the
operator and the planner) and ``lora_client`` (a worker's ``/v1/loras``, for the operator and dynamo-run)."""
