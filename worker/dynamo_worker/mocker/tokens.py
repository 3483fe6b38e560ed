"""Which token ids the mocker emits: valid, readable ids of the model's tokenizer, chosen
deterministically from the seed and the whole sequence before the token (prompt and the tokens emitted
so far), as a greedy model does. So the same request always gets the same answer, and a request
continued from its prompt plus the tokens it already emitted (a migrated stream) gets exactly the tokens
it would have got next: its continuation can be checked token for token. The sequence is folded into a
64-bit state one token at a time (``prompt_digest``, ``next_state``), so a token costs the same however
long the sequence.

The candidates are the ids whose text is a short word (optionally with a leading space), so the
detokenized output is readable and never splits a UTF-8 character; special tokens are excluded.
Without a tokenizer, ids ``[min_id, vocab_size)`` are used.
"""

from __future__ import annotations

import hashlib
import logging
import re
import struct
from collections.abc import Sequence
from pathlib import Path

__all__ = ["TokenSampler", "next_state", "prompt_digest"]

log = logging.getLogger(__name__)

_WORD = re.compile(r"^ ?[A-Za-z]{1,12}$")
_PRINTABLE = re.compile(r"^[ -~]{1,16}$")


_M64 = (1 << 64) - 1


def next_state(state: int, token: int) -> int:
    """The state after one more token (splitmix64's mixing of the state and the token)."""
    x = (state ^ token) + 0x9E3779B97F4A7C15 & _M64
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _M64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _M64
    return x ^ (x >> 31)


def prompt_digest(token_ids: Sequence[int], seed: int) -> int:
    """The state after the seed and every token of ``token_ids``."""
    state = next_state(seed & _M64, 0)
    for token in token_ids:
        state = next_state(state, token)
    return state


def _u64(digest: int, position: int, salt: int) -> int:
    data = struct.pack("<QQQ", digest, position, salt)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class TokenSampler:
    def __init__(self, candidates: Sequence[int]) -> None:
        if not candidates:
            raise ValueError("no candidate token ids")
        self.candidates = list(candidates)

    @classmethod
    def from_vocab_size(cls, vocab_size: int, min_id: int = 3) -> TokenSampler:
        return cls(range(min_id, max(vocab_size, min_id + 1)))

    @classmethod
    def from_model_dir(cls, model_dir: Path, fallback_vocab_size: int) -> TokenSampler:
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            log.warning("No tokenizer.json in %s; emitting ids below %s", model_dir, fallback_vocab_size)
            return cls.from_vocab_size(fallback_vocab_size)
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        special = set(tokenizer.get_added_tokens_decoder())  # ids of added (special) tokens
        texts = {
            i: tokenizer.decode([i], skip_special_tokens=False) for i in range(tokenizer.get_vocab_size())
        }
        words = [i for i, t in texts.items() if i not in special and _WORD.match(t)]
        if len(words) < 16:
            words = [i for i, t in texts.items() if i not in special and _PRINTABLE.match(t)]
        if not words:
            return cls.from_vocab_size(tokenizer.get_vocab_size())
        return cls(words)

    def token(self, digest: int, position: int) -> int:
        return self.candidates[_u64(digest, position, 0) % len(self.candidates)]

    def chance(self, digest: int, position: int) -> float:
        """A uniform number in [0, 1) for (digest, position): decides eos deterministically."""
        return _u64(digest, position, 1) / 2**64
