"""A scripted reply goes on where a migrated request broke off: its prompt carries the tokens already
streamed, so the mocker answers only the rest of the reply (a tool call split across two workers is
still one tool call), as a greedy model would; a fresh prompt gets the whole reply."""

from __future__ import annotations

from dynamo_worker.mocker.engine import script_continuation

REPLY = [7, 8, 9, 7, 8, 10]


def test_a_fresh_prompt_gets_the_whole_reply():
    assert script_continuation(REPLY, [1, 2, 3]) == REPLY
    assert script_continuation(REPLY, []) == REPLY


def test_a_continuation_gets_the_rest():
    assert script_continuation(REPLY, [1, 2, 7, 8]) == [9, 7, 8, 10]
    assert script_continuation(REPLY, [1, 7, 8, 9, 7, 8]) == [10]  # the longest prefix, not the first
    assert script_continuation(REPLY, [1, *REPLY]) == []
