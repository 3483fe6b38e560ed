"""``python -m dynamo.sglang``: runs this image's counterpart (``dynamo_worker.aliases``)."""
