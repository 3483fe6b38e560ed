"""Which token ids the mocker emits: valid, readable ids of the model's tokenizer, chosen
deterministically from the seed and the whole sequence before the token (prompt and the tokens emitted
so far), as a greedy model does. So the same request always gets the same answer, and a request
continued from its prompt plus the tokens it already emitted (a migrated stream) gets exactly the tokens
it would have got next: its continuation can be checked token for token. The sequence is folded into a
64-bit state one token at a time (``prompt_digest``, ``next_state``), so a token costs the same however
long the sequence. The state is two running checksums of the tokens as 8-byte integers (CRC-32 in the
high half, Adler-32 in the low one): both continue from a previous value, so folding a prompt at once
(``zlib``, in C) gives the state that folding it token by token does, and a 2048-token prompt costs
about 40 us, where a per-token mixing function in Python took about 3 ms (in a burst of 16 such
prompts the simulated engine's first prefill waited for that, which no engine spends). The tokens come
from a hash of the state (``TokenSampler``), so their mixing is that hash's.

The candidates are the ids whose text is a short word (optionally with a leading space), so the
detokenized output is readable and never splits a UTF-8 character; special tokens are excluded.
Without a tokenizer, ids ``[min_id, vocab_size)`` are used.
"""

from __future__ import annotations

import hashlib
import logging
import re
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

__all__ = ["TokenSampler", "next_state", "prompt_digest"]

log = logging.getLogger(__name__)

_WORD = re.compile(r"^ ?[A-Za-z]{1,12}$")
_PRINTABLE = re.compile(r"^[ -~]{1,16}$")


_M64 = (1 << 64) - 1
_TOKEN = struct.Struct("<q")
_SEED = struct.Struct("<Q")


def _fold(state: int, data: bytes) -> int:
    return zlib.crc32(data, state >> 32) << 32 | zlib.adler32(data, state & 0xFFFFFFFF)


def next_state(state: int, token: int) -> int:
    """The state after one more token."""
    return _fold(state, _TOKEN.pack(token))


def prompt_digest(token_ids: Sequence[int], seed: int) -> int:
    """The state after the seed and every token of ``token_ids`` (``next_state`` over each, at once)."""
    start = _fold(1, _SEED.pack(seed & _M64))
    return _fold(start, struct.pack(f"<{len(token_ids)}q", *token_ids))


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
