"""``python -m dynamo.planner``: runs this image's counterpart (``dynamo_worker.aliases``)."""
