"""NVIDIA Dynamo's module names in the dynamo-sglang runtime image (see ``dynamo_worker.aliases``)."""
