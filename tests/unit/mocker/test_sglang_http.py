"""SGLang's ``/generate`` body onto the engine's request, and the engine's usage onto SGLang's
``meta_info`` (``dynamo_worker.mocker.sglang_http``, pure functions)."""

from __future__ import annotations

import pytest
from dynamo_worker.mocker.sglang_http import BadRequest, generate_request, meta_info
from dynamo_worker.protocol import Usage


def test_sampling_params_map_onto_the_engine_request():
    body = {
        "input_ids": [5, 6, 7],
        "rid": "r1",
        "stream": True,
        "sampling_params": {"max_new_tokens": 9, "min_new_tokens": 2, "temperature": 0, "top_k": 4,
                            "sampling_seed": 3, "stop_token_ids": [11], "ignore_eos": True},
    }  # fmt: skip
    request, stream = generate_request(body, "m", [2])
    assert stream and request.request_id == "r1" and request.token_ids == [5, 6, 7]
    assert request.stop.max_tokens == 9 and request.stop.min_tokens == 2 and request.stop.ignore_eos
    assert request.stop.stop_token_ids == [11] and request.eos_token_ids == [2]
    assert request.sampling.temperature == 0 and request.sampling.top_k == 4 and request.sampling.seed == 3


def test_defaults_and_text():
    request, stream = generate_request({"text": "a b"}, "m", [], encode=lambda t: [len(t)])
    assert not stream and request.token_ids == [3] and request.stop.max_tokens == 128  # SGLang's default


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"input_ids": [1], "sampling_params": {"stop": ["\n"]}}, "stop"),
        ({"input_ids": [1], "return_logprob": True}, "return_logprob"),
        ({"input_ids": [[1], [2]]}, "batches"),
        ({"text": "x"}, "tokenizer"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}, "max_tokens"),
        ({"input_ids": [1], "sampling_params": {"bogus": 1}}, "bogus"),
    ],
)
def test_what_cannot_be_simulated_is_refused_by_name(body, names):
    with pytest.raises(BadRequest, match=names):
        generate_request(body, "m", [])


def test_meta_info_splits_cached_tokens_by_tier_in_the_last_event():
    running = meta_info("r", 10, [1, 2], None, None)
    assert "cached_tokens" not in running and running["completion_tokens"] == 2
    done = meta_info("r", 10, [1, 2], {"type": "length", "length": 2}, Usage(
        prompt_tokens=10, completion_tokens=2, cached_tokens=8, cached_tokens_host=5))  # fmt: skip
    assert done["cached_tokens"] == 8 and done["cached_tokens_details"] == {"device": 3, "host": 5}
