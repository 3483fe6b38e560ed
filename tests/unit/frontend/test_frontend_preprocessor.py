"""Chat templates rendered like transformers (special tokens, add_generation_prompt, raise_exception
mapped to a 400), prompt tokenization with and without special tokens, and model facts read from the
HF files (eos ids, context length)."""

from __future__ import annotations

import pytest
from dynamo_worker.frontend.errors import InvalidRequest
from dynamo_worker.frontend.models.preprocessor import ModelFiles, Preprocessor


def test_chat_template_renders_like_transformers(model_dir):
    pre = Preprocessor.from_dir(model_dir)
    text = pre.render_chat([{"role": "user", "content": "Hi"}])
    assert text == "<s><|user|>Hi</s>\n<|assistant|>"
    assert pre.render_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=False).endswith(
        "</s>\n"
    )


def test_encode_chat_does_not_add_special_tokens_twice(model_dir):
    pre = Preprocessor.from_dir(model_dir)
    ids = pre.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[0] == pre.tokenizer.token_to_id("<s>")
    assert ids.count(pre.tokenizer.token_to_id("<s>")) == 1


@pytest.mark.parametrize("words", [1, 12_000])
def test_prompts_tokenize_to_the_tokenizers_own_ids(model_dir, words):
    # the ids-only fast path gives exactly what the tokenizer's plain encode does, short or long
    pre = Preprocessor.from_dir(model_dir)
    text = " ".join(["hello world, <s>again</s>"] * words)
    assert pre.encode_prompt(text) == pre.tokenizer.encode(text).ids
    assert (
        pre.encode_chat([{"role": "user", "content": text}])
        == pre.tokenizer.encode(
            pre.render_chat([{"role": "user", "content": text}]), add_special_tokens=False
        ).ids
    )


def test_raise_exception_becomes_400_on_messages(model_dir):
    pre = Preprocessor.from_dir(model_dir)
    with pytest.raises(InvalidRequest) as e:
        pre.render_chat([{"role": "tool", "content": "x"}])
    assert e.value.param == "messages" and "roles must be" in e.value.message


def test_model_facts_from_files_and_card(model_dir):
    pre = Preprocessor.from_dir(model_dir)
    assert pre.eos_token_ids == (1,) and pre.context_length == 256
    card = Preprocessor.from_dir(model_dir, ModelFiles(context_length=99, eos_token_ids=(7, 8)))
    assert card.eos_token_ids == (7, 8) and card.context_length == 99


def test_out_of_vocabulary_ids_are_refused(model_dir):
    pre = Preprocessor.from_dir(model_dir)
    with pytest.raises(InvalidRequest) as e:
        pre.check_ids([1, 10**6])
    assert e.value.param == "prompt[1]"


def test_no_chat_template_is_a_clear_400(model_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_text((model_dir / "tokenizer.json").read_text())
    pre = Preprocessor.from_dir(tmp_path)
    with pytest.raises(InvalidRequest) as e:
        pre.render_chat([{"role": "user", "content": "x"}])
    assert e.value.code == "no_chat_template"
