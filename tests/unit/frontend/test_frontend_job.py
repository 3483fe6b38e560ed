"""The prompt size a response reports: the frontend's own token count, except for a request with images,
whose engine may add tokens around each image (Qwen2-VL's vision start and end): then the worker's."""

from __future__ import annotations

from types import SimpleNamespace

from dynamo_worker.frontend.requests.job import prompt_tokens
from dynamo_worker.protocol import Usage


def job(images: list[object]) -> SimpleNamespace:
    return SimpleNamespace(prompt_ids=[1] * 80, generate=SimpleNamespace(images=images))


def test_text_requests_report_the_frontends_count():
    assert prompt_tokens(job([]), Usage(prompt_tokens=82, completion_tokens=8)) == 80  # type: ignore[arg-type]


def test_image_requests_report_the_tokens_the_engine_processed():
    assert prompt_tokens(job(["span"]), Usage(prompt_tokens=82, completion_tokens=8)) == 82  # type: ignore[arg-type]
    assert prompt_tokens(job(["span"]), None) == 80  # type: ignore[arg-type]  # no usage from the worker
