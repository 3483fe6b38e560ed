"""``python -m dynamo.frontend``: runs this image's counterpart (``dynamo_worker.aliases``)."""
