"""``python -m dynamo.mocker``: runs this image's counterpart (``dynamo_worker.aliases``)."""
