"""Incremental detokenization (multi-byte characters split across tokens never produce U+FFFD
halves; the concatenated deltas equal a full decode) and stop handling (stop strings across chunk
boundaries never leak, held-back prefixes are released when they turn out not to be stops, stop
token ids end the output)."""

from __future__ import annotations

import pytest
from dynamo_worker.frontend.output.shaping import IncrementalDetokenizer, OutputText, StopStringMatcher

SAMPLES = [
    "Hello world",
    "caf\u00e9 \U0001f600 \u65e5\u672c\u8a9e text",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467 family",
    "\u00fcber stra\u00dfe \u2603\u2603",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_one_token_at_a_time_equals_full_decode_without_replacement(tokenizer, text):
    ids = tokenizer.encode(text).ids
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push([t]) for t in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == tokenizer.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


def test_multibyte_character_split_over_byte_tokens_is_held_until_complete(tokenizer):
    ids = tokenizer.encode("\U0001f600").ids
    assert len(ids) > 1, "the emoji must span several byte tokens for this test to mean anything"
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.push([t]) for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push([ids[-1]]) == "\U0001f600"


def test_truncated_character_at_end_of_stream_decodes_as_full_decode_would(tokenizer):
    ids = tokenizer.encode("a\U0001f600").ids[:-1]
    detok = IncrementalDetokenizer(tokenizer)
    out = "".join(detok.push([t]) for t in ids) + detok.flush()
    assert out == tokenizer.decode(ids)


def test_context_ids_are_not_emitted(tokenizer):
    prompt = tokenizer.encode("Hello").ids
    out = tokenizer.encode(" world").ids
    detok = IncrementalDetokenizer(tokenizer, prompt)
    assert "".join(detok.push([t]) for t in out) + detok.flush() == " world"


def test_special_tokens_are_skipped(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    eos = tokenizer.token_to_id("</s>")
    assert detok.push([*tokenizer.encode("Hi").ids, eos]) == "Hi"


def test_empty_push_emits_nothing(tokenizer):
    assert IncrementalDetokenizer(tokenizer).push([]) == ""


@pytest.mark.parametrize(
    ("chunks", "stops", "emitted", "stopped"),
    [
        (["Hello ", "wor", "ld"], ["world"], "Hello ", True),
        (["abc", "STO", "P tail"], ["STOP"], "abc", True),
        (["ab", "S", "T", "x"], ["STOP"], "abSTx", False),
        (["xxSTOPyy"], ["STOP"], "xx", True),
        (["one two"], ["two", "one"], "", True),
        (["aab"], ["ab"], "a", True),
        (["S"], ["STOP"], "S", False),
    ],
)
def test_stop_strings_across_chunks(chunks, stops, emitted, stopped):
    m = StopStringMatcher(stops)
    out, hit = "", False
    for c in chunks:
        text, hit = m.push(c)
        out += text
        if hit:
            break
    if not hit:
        out += m.flush()
    assert (out, hit) == (emitted, stopped)


def test_held_text_is_only_a_possible_stop_prefix():
    m = StopStringMatcher(["</answer>"])
    assert m.push("result </ans") == ("result ", False)
    assert m.push("wer") == ("", False)
    assert m.push("x") == ("</answerx", False)


def test_no_prefix_of_stop_is_ever_emitted_over_any_split():
    text, stop = "the answer is 42. END of story", "END"
    for split in range(1, len(text)):
        m = StopStringMatcher([stop])
        out = ""
        for piece in (text[:split], text[split:]):
            emitted, hit = m.push(piece)
            out += emitted
            if hit:
                break
        assert out == "the answer is 42. "


def test_output_text_stop_string_spanning_tokens(tokenizer):
    ids = tokenizer.encode("The quick brown fox jumps").ids
    out = OutputText(tokenizer, stop_strings=["brown f"])
    text, count = "", 0
    for t in ids:
        d = out.push([t])
        text += d.text
        count += d.token_count
        if d.stopped:
            break
    assert text == "The quick "
    assert out.stopped and out.finish() == ""


def test_output_text_stop_token_id_cuts_and_flushes(tokenizer):
    ids = tokenizer.encode("Hello world, this is").ids
    assert len(ids) > 3
    stop_id = ids[2]
    out = OutputText(tokenizer, stop_token_ids=[stop_id], stop_strings=["zzz"])
    d = out.push(ids)
    assert d.stopped and d.token_count == 2
    assert d.text == tokenizer.decode(ids[:2])


def test_output_text_finish_releases_held_text(tokenizer):
    out = OutputText(tokenizer, stop_strings=["world!"])
    d = out.push(tokenizer.encode("Hello world").ids)
    assert not d.stopped and d.text == "Hello "
    assert out.finish() == "world"


def test_sentencepiece_style_word_starts_keep_their_spaces():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>"], show_progress=False)
    tok.train_from_iterator(["the cat sat on the mat with another cat"] * 10, trainer)
    prompt = tok.encode("the cat").ids
    out = tok.encode(" sat on the mat").ids
    detok = IncrementalDetokenizer(tok, prompt)
    text = "".join(detok.push([t]) for t in out) + detok.flush()
    assert text == " sat on the mat"


def _one_by_one(out: OutputText, ids: list[int]) -> tuple[list[str], int, bool]:
    texts, count = [], 0
    for t in ids:
        delta = out.push([t])
        texts.append(delta.text)
        count += delta.token_count
        if delta.stopped:
            return texts, count, True
    return texts, count, False


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize(
    ("stop_strings", "stop_word"), [((), None), (("d",), None), ((), "text"), ((), "family")]
)
@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_push_each_is_push_of_each_id_in_turn(tokenizer, text, stop_strings, stop_word, size):
    """Over any split into chunks, with and without stops (strings, ids): the same text per id, the
    same ids counted, the same stop, and the same text left at the end (held bytes flushed)."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    stop_ids = tokenizer.encode(stop_word, add_special_tokens=False).ids[:1] if stop_word else []
    prompt = tokenizer.encode("Hello", add_special_tokens=False).ids
    one, each = (
        OutputText(tokenizer, prompt_ids=prompt, stop_strings=stop_strings, stop_token_ids=stop_ids)
        for _ in "ab"
    )
    for i in range(0, len(ids), size):
        expected = _one_by_one(one, ids[i : i + size])
        assert each.push_each(ids[i : i + size]) == expected
        if expected[2]:
            break
    assert each.finish() == one.finish()
