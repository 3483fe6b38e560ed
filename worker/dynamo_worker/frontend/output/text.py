"""From generated token ids to the text a client sees: incremental detokenization and stop handling.

``IncrementalDetokenizer`` decodes a growing id sequence in small windows and emits only complete
characters: while the text decoded so far ends in U+FFFD (a multi-byte character split across
tokens), nothing is emitted until the following token completes it. It starts from the last few
prompt ids so tokenizers that mark word starts (SentencePiece's leading space) keep their spaces.

``StopStringMatcher`` cuts the text at the first stop string and never lets any part of one reach the
client: text that could be the beginning of a stop string is held back until the next chunk proves
it is not (or ends the stream).

``WindowDetokenizer`` does the same over any object with ``decode(ids, skip_special_tokens)`` (e.g. a
decoder that keeps the special tokens a tool-call parser needs) by decoding a small window twice per
chunk; ``OutputText`` uses ``IncrementalDetokenizer`` for a ``tokenizers.Tokenizer`` and it otherwise.

``KeepSpecialDecoder`` decodes like the preprocessor but keeps the special tokens a parser needs.

``OutputText`` combines them with stop token ids; it is pure (no I/O) and fed chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

__all__ = [
    "Decoder",
    "Delta",
    "IncrementalDetokenizer",
    "KeepSpecialDecoder",
    "OutputText",
    "StopStringMatcher",
    "WindowDetokenizer",
]

REPLACEMENT = "\ufffd"
_CONTEXT_IDS = 5  # earlier ids kept in the decode window (enough for SentencePiece word starts)


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Streams text with the ``tokenizers`` library's ``DecodeStream`` (its window and UTF-8 handling
    run in Rust: one call per chunk instead of two full decodes of a Python-kept window)."""

    def __init__(
        self, tokenizer: Tokenizer, context_ids: Sequence[int] = (), skip_special_tokens: bool = True
    ):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._last: list[int] = list(context_ids[-_CONTEXT_IDS:])  # ids of the latest emitted text
        self._stream = DecodeStream(ids=self._last, skip_special_tokens=skip_special_tokens)
        self._held: list[int] = []  # ids whose text is not complete yet

    def push(self, token_ids: Sequence[int]) -> str:
        """Add ids; return the newly completed text (possibly empty)."""
        if not token_ids:
            return ""
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        text = self._stream.step(self._tok, ids)
        if text is None:  # nothing new yet, or a character still incomplete
            self._held.extend(ids)
            return ""
        self._last, self._held = [*self._held, *ids][-_CONTEXT_IDS:], []
        return text

    def push_each(self, token_ids: Sequence[int]) -> list[str]:
        """``push`` of each id in turn: the newly completed text after each (possibly empty)."""
        step, tok, held = self._stream.step, self._tok, self._held
        texts: list[str] = []
        begin, emitted = 0, None  # start of the ids whose text is not complete; the last complete run
        for i, t in enumerate(token_ids):
            text = step(tok, t)
            if text is None:
                texts.append("")
            else:
                texts.append(text)
                emitted, begin = (begin, i + 1), i + 1
        if emitted is None:
            held.extend(token_ids)
        else:
            start, end = emitted
            self._last = [*(held if start == 0 else ()), *token_ids[start:end]][-_CONTEXT_IDS:]
            self._held = list(token_ids[end:])
        return texts

    def flush(self) -> str:
        """At the end of the stream: whatever is still held (an incomplete character decodes as U+FFFD,
        as a full decode would)."""
        if not self._held:
            return ""
        prefix_text = self._tok.decode(self._last, skip_special_tokens=self._skip)
        full_text = self._tok.decode(self._last + self._held, skip_special_tokens=self._skip)
        self._last, self._held = (self._last + self._held)[-_CONTEXT_IDS:], []
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""


class WindowDetokenizer:
    """Streams text through any ``Decoder``: decodes the window of the last emitted ids with and without
    the new ones and emits the difference, holding back text that ends in U+FFFD."""

    def __init__(self, decoder: Decoder, context_ids: Sequence[int] = (), skip_special_tokens: bool = True):
        self._tok = decoder
        self._skip = skip_special_tokens
        self._ids: list[int] = list(context_ids[-_CONTEXT_IDS:])
        self._prefix = 0  # start of the decode window
        self._read = len(self._ids)  # ids before this are already emitted as text

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add ids; return the newly completed text (possibly empty)."""
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT):
            return ""  # nothing new yet, or a character still incomplete
        delta = full_text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self._ids)
        return delta

    def flush(self) -> str:
        """At the end of the stream: whatever is still held (an incomplete character decodes as U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""


class KeepSpecialDecoder:
    """Decodes like the preprocessor, but keeps the special tokens a parser needs (``<|channel|>``,
    ``<|python_tag|>``, ...) while still skipping every other special token."""

    def __init__(self, preprocessor: Any, keep: frozenset[str]) -> None:
        self._pre: Decoder = preprocessor
        added = preprocessor.tokenizer.get_added_tokens_decoder()
        self._drop = frozenset(i for i, t in added.items() if t.special and t.content not in keep)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._pre.decode([i for i in ids if i not in self._drop], skip_special_tokens=False)


class StopStringMatcher:
    def __init__(self, stop_strings: Sequence[str]):
        self._stops = [s for s in stop_strings if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""

    @property
    def active(self) -> bool:
        """Whether there is any stop string to look for."""
        return bool(self._stops)

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was found). After a stop,
        everything from the stop string on is dropped."""
        if not self._stops:
            return text, False
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buf[:cut], True
        hold = 0
        for k in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self._stops):
                hold = k
                break
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        """At the end of the stream without a stop: the held text was not a stop string after all."""
        held, self._held = self._held, ""
        return held


class Delta(NamedTuple):
    text: str
    token_count: int  # ids consumed from this chunk (up to and excluding a stop token id)
    stopped: bool  # a stop string or stop token id ended the output


class OutputText:
    """Detokenize, apply stop token ids and stop strings, chunk by chunk."""

    def __init__(
        self,
        tokenizer: Tokenizer | Decoder,
        *,
        prompt_ids: Sequence[int] = (),
        stop_strings: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
    ):
        self._detok: IncrementalDetokenizer | WindowDetokenizer = (
            IncrementalDetokenizer(tokenizer, prompt_ids)
            if isinstance(tokenizer, Tokenizer)
            else WindowDetokenizer(tokenizer, prompt_ids)
        )
        self._stops = StopStringMatcher(stop_strings)
        self._stop_ids = frozenset(stop_token_ids)
        self.stopped = False

    def push(self, token_ids: Sequence[int]) -> Delta:
        if self.stopped:
            return Delta("", 0, True)
        ids = list(token_ids)
        hit_stop_id = False
        if self._stop_ids:
            for i, t in enumerate(ids):
                if t in self._stop_ids:
                    ids, hit_stop_id = ids[:i], True
                    break
        text, stopped = self._stops.push(self._detok.push(ids))
        if hit_stop_id and not stopped:
            tail, stopped = self._stops.push(self._detok.flush())
            text += tail
            if not stopped:
                text += self._stops.flush()
            stopped = True
        self.stopped = stopped
        return Delta(text, len(ids), stopped)

    def push_each(self, token_ids: Sequence[int]) -> tuple[list[str], int, bool]:
        """``push`` of each id in turn, up to a stop: the text of each, the ids consumed, and whether
        it stopped. Without stop strings and stop ids in ``token_ids``, in one pass of the
        detokenizer (a call per id through ``push`` cost more than decoding the id)."""
        detok = self._detok
        if (
            not self.stopped
            and not self._stops.active
            and self._stop_ids.isdisjoint(token_ids)
            and isinstance(detok, IncrementalDetokenizer)
        ):
            return detok.push_each(token_ids), len(token_ids), False
        texts: list[str] = []
        count = 0
        for t in token_ids:
            delta = self.push((t,))
            texts.append(delta.text)
            count += delta.token_count
            if delta.stopped:
                return texts, count, True
        return texts, count, self.stopped

    def finish(self) -> str:
        """The stream ended without a stop: the text still held back."""
        if self.stopped:
            return ""
        text, stopped = self._stops.push(self._detok.flush())
        self.stopped = stopped
        return text if stopped else text + self._stops.flush()
