"""OpenAI-compatible frontend: tokenize, chat template, route, stream, detokenize, stop strings."""

from dynamo_worker.frontend.app import Frontend, run_frontend
from dynamo_worker.frontend.settings import FrontendSettings

__all__ = ["Frontend", "FrontendSettings", "run_frontend"]
