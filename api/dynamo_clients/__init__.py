"""The I/O both packages share, on the pure base ``dynamo_api``: ``lora_client`` (a worker's
``/v1/loras``, for the operator and dynamo-run)."""
