"""``POST /v1/completions`` up to the job, from the parsed and validated body
(``protocol.parse_request``; the server holds it for a slot in between, ``serving.admission``):
look the model up (404 unknown, 503 nobody serving it), plan the features it uses (a grammar, logprobs),
tokenize the prompt (or check the ids sent) and check the context length (``requests.job.build_job``).
"""

from __future__ import annotations

import json

from dynamo_worker.frontend.errors import InvalidRequest
from dynamo_worker.frontend.models.preprocessor import encode_off_loop
from dynamo_worker.frontend.models.registry import ModelRegistry
from dynamo_worker.frontend.protocol import CompletionRequest, check_schema
from dynamo_worker.frontend.requests.chat import check_endpoint, constraint, extension_grammars
from dynamo_worker.frontend.requests.job import FeaturePlan, Grammar, Job, build_job, with_plan
from dynamo_worker.protocol import ServingFeatures, StructuredOutput

__all__ = ["COMPLETIONS_DEFAULT_MAX_TOKENS", "plan_completion", "prepare_completion"]

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


async def prepare_completion(registry: ModelRegistry, req: CompletionRequest) -> Job:
    entry = registry.lookup(req.model)
    pre = entry.preprocessor
    assert pre is not None
    plan = plan_completion(req, pre.features)
    prompt = req.prompt_text_or_ids()
    if isinstance(prompt, str):
        ids = await encode_off_loop(len(prompt), pre.encode_prompt, prompt)
    else:
        pre.check_ids(prompt)
        ids = prompt
    job = build_job(
        "completion", req, entry, ids, prompt_param="prompt", default_max=COMPLETIONS_DEFAULT_MAX_TOKENS
    )
    return with_plan(job, plan)


def plan_completion(req: CompletionRequest, features: ServingFeatures) -> FeaturePlan | None:
    check_endpoint(features, "completion", req.model)
    grammars = [*_json_schema_grammar(req.json_schema), *extension_grammars(req)]
    plan = FeaturePlan(structured=constraint(grammars, features, req.model), logprobs=req.logprobs)
    return plan if plan.shapes_answer() else None


def _json_schema_grammar(json_schema: str | None) -> list[Grammar]:
    """The completions extension ``json_schema`` (a JSON schema as text), checked."""
    if json_schema is None:
        return []
    try:
        check_schema(json.loads(json_schema), "json_schema")
    except ValueError as e:
        raise InvalidRequest(
            f"Invalid value for 'json_schema': {e}; send a JSON schema as a JSON string.",
            param="json_schema",
            code="invalid_value",
        ) from None
    return [("json_schema", StructuredOutput(json_schema=json_schema))]
