"""What the load generator sends: length distributions, prompts, arrival schedules, conversations.

Pure functions and plain data: every draw comes from a ``random.Random`` the caller seeds, so a
workload is reproducible from its seed.

- ``LengthDist``: ``fixed:N``, ``uniform:LO,HI`` or ``normal:MEAN,STD[,LO,HI]`` (clamped, >= 1).
- ``random_prompt``: ``n`` words drawn from a list of common English words. Such words are about one
  token each in the large BPE vocabularies of served models, so the prompt's token count is roughly
  ``n`` (small vocabularies split them: the project's tiny test model makes about 2.7 tokens of each).
- ``poisson_arrivals`` / ``iter_poisson_arrivals``: send times of an open-loop run (exponential gaps
  at ``rate`` per second).
- ``shared_prefix_turns``: N system prompts x M users x T turns, ordered turn by turn; each user's turn
  ``t + 1`` is its conversation so far (system prompt, earlier turns and the answers received) plus a
  new user message, built by ``conversation_messages``. Requests of users that share a system prompt
  share a prefix, which is what a KV-aware router exploits.
- ``prefix_pool_requests``: token-id prompts, each one of ``num_prefixes`` shared prefixes plus a
  unique suffix, in random order (the "prefix64" workload of the router benchmark).
- ``conversation_trace``: a Mooncake-style multi-turn trace in token ids: conversations that share a
  few system prompts, each turn's prompt being the previous turn's plus a stand-in for the answer and
  a new user message, so consecutive turns share a growing prefix.
Token-id workloads go through the completions API (``prompt`` as a list of ids) and need no tokenizer.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "WORDS",
    "LengthDist",
    "RequestSpec",
    "Turn",
    "conversation_messages",
    "conversation_trace",
    "iter_poisson_arrivals",
    "poisson_arrivals",
    "prefix_pool_requests",
    "random_prompt",
    "random_requests",
    "shared_prefix_turns",
]

_COMMON_WORDS = """
    the of and to in is was he for it with as his on be at by had are but from or have an they which one
    you were her all she there would their we him been has when who will more no if out so said what up
    its about into than them can only other new some could time these two may then do first any my now
    such like our over man me even most made after also did many before must through back years where
    much your way well down should because each just those people how too little state good very make
    world still own see men work long get here between both life being under never day same another know
    while last might us great old year off come since against go came right used take three place small
    found water house light again name room night hand world part city land book story point home water
    green river stone music paper table window garden market letter number family school friend morning
"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_COMMON_WORDS.split()))


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts: fixed, uniform on [lo, hi], or normal(mean, std) clamped."""

    kind: Literal["fixed", "uniform", "normal"]
    a: float  # fixed: the value; uniform: lo; normal: mean
    b: float = 0.0  # uniform: hi; normal: std
    lo: int = 1
    hi: int = 1 << 20

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        """``fixed:128``, ``uniform:64,256``, ``normal:128,32`` or ``normal:128,32,16,512`` (clamps)."""
        m = re.fullmatch(r"\s*(fixed|uniform|normal)\s*:\s*([0-9.,\s]+)", text)
        if not m:
            raise ValueError(
                f"bad length distribution {text!r}: use fixed:N, uniform:LO,HI or normal:MEAN,STD[,LO,HI]"
            )
        kind = m.group(1)
        try:
            nums = [float(x) for x in m.group(2).split(",")]
        except ValueError:
            raise ValueError(f"bad numbers in length distribution {text!r}") from None
        if kind == "fixed" and len(nums) == 1 and nums[0] >= 1:
            return cls("fixed", nums[0])
        if kind == "uniform" and len(nums) == 2 and 1 <= nums[0] <= nums[1]:
            return cls("uniform", nums[0], nums[1])
        if kind == "normal" and len(nums) in (2, 4) and nums[0] >= 1 and nums[1] >= 0:
            lo, hi = (int(nums[2]), int(nums[3])) if len(nums) == 4 else (1, 1 << 20)
            if 1 <= lo <= hi:
                return cls("normal", nums[0], nums[1], lo, hi)
        raise ValueError(
            f"bad length distribution {text!r}: fixed:N needs N >= 1, uniform:LO,HI needs 1 <= LO <= HI, "
            "normal:MEAN,STD[,LO,HI] needs MEAN >= 1, STD >= 0 and 1 <= LO <= HI"
        )

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        return max(self.lo, min(self.hi, round(rng.gauss(self.a, self.b))))

    def __str__(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{int(self.a)}"
        if self.kind == "uniform":
            return f"uniform:{int(self.a)},{int(self.b)}"
        return f"normal:{self.a:g},{self.b:g},{self.lo},{self.hi}"


def random_prompt(rng: random.Random, words: int) -> str:
    """``words`` random common words separated by spaces (about ``words`` tokens)."""
    return " ".join(rng.choices(WORDS, k=max(1, words)))


@dataclass(frozen=True)
class RequestSpec:
    """One request to send. ``messages`` for chat; the completions API sends them joined as a prompt.
    ``user`` and ``turn`` identify a conversation turn (shared-prefix workload), else -1."""

    index: int
    messages: tuple[dict[str, str], ...]
    max_tokens: int
    input_words: int
    user: int = -1
    turn: int = -1
    prompt_ids: tuple[int, ...] | None = None  # token ids: sent as the completions prompt instead

    @property
    def prompt(self) -> str:
        return "\n".join(m["content"] for m in self.messages)


def random_requests(
    rng: random.Random, input_len: LengthDist, output_len: LengthDist
) -> Iterator[RequestSpec]:
    """An endless stream of single-message requests with lengths drawn from the distributions."""
    index = 0
    while True:
        words = input_len.sample(rng)
        messages = ({"role": "user", "content": random_prompt(rng, words)},)
        yield RequestSpec(index, messages, output_len.sample(rng), words)
        index += 1


def iter_poisson_arrivals(rate: float, rng: random.Random) -> Iterator[float]:
    """Endless send times (seconds from the start) of a Poisson process of ``rate`` requests per
    second: cumulative sums of exponential gaps. The first request arrives after its own gap."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        yield t


def poisson_arrivals(rate: float, count: int, rng: random.Random) -> list[float]:
    """The first ``count`` times of ``iter_poisson_arrivals``."""
    return list(itertools.islice(iter_poisson_arrivals(rate, rng), count))


@dataclass(frozen=True)
class Turn:
    """One user message of the shared-prefix workload: user ``user`` (who shares system prompt
    ``prefix``) speaks for the ``turn``-th time."""

    index: int
    user: int
    prefix: int
    turn: int
    message: str
    max_tokens: int
    input_words: int


@dataclass(frozen=True)
class SharedPrefixPlan:
    system_prompts: tuple[str, ...]
    turns: tuple[Turn, ...] = field(repr=False)


def shared_prefix_turns(
    rng: random.Random,
    *,
    num_prefixes: int,
    users_per_prefix: int,
    turns: int,
    prefix_words: int,
    input_len: LengthDist,
    output_len: LengthDist,
) -> SharedPrefixPlan:
    """``num_prefixes`` system prompts of ``prefix_words`` words, each shared by ``users_per_prefix``
    users, who speak ``turns`` times. Order: every user's turn 0 (users shuffled), then every user's
    turn 1, ...; user ``u`` shares system prompt ``u // users_per_prefix``."""
    if min(num_prefixes, users_per_prefix, turns, prefix_words) < 1:
        raise ValueError("num_prefixes, users_per_prefix, turns and prefix_words must be >= 1")
    system_prompts = tuple(random_prompt(rng, prefix_words) for _ in range(num_prefixes))
    users = list(range(num_prefixes * users_per_prefix))
    out: list[Turn] = []
    for t in range(turns):
        rng.shuffle(users)
        for u in users:
            words = input_len.sample(rng)
            out.append(
                Turn(
                    len(out),
                    u,
                    u // users_per_prefix,
                    t,
                    random_prompt(rng, words),
                    output_len.sample(rng),
                    words,
                )
            )
    return SharedPrefixPlan(system_prompts, tuple(out))


def conversation_messages(
    system_prompt: str, history: Sequence[tuple[str, str]], message: str
) -> tuple[dict[str, str], ...]:
    """The chat messages of a turn: the system prompt, each earlier (user, assistant) exchange, and
    the new user message. Turn ``t + 1``'s messages start with turn ``t``'s plus its answer."""
    msgs: list[dict[str, str]] = [{"role": "system", "content": system_prompt}]
    for user_text, answer in history:
        msgs.append({"role": "user", "content": user_text})
        msgs.append({"role": "assistant", "content": answer})
    msgs.append({"role": "user", "content": message})
    return tuple(msgs)


def _tokens(rng: random.Random, n: int, vocab: tuple[int, int]) -> list[int]:
    return [rng.randrange(vocab[0], vocab[1]) for _ in range(n)]


def prefix_pool_requests(
    rng: random.Random,
    *,
    num_prefixes: int,
    prefix_tokens: int,
    suffix_tokens: int,
    num_requests: int,
    max_tokens: int,
    vocab: tuple[int, int] = (16, 800),
) -> list[RequestSpec]:
    """``num_requests`` prompts, each a uniformly drawn one of ``num_prefixes`` random prefixes of
    ``prefix_tokens`` token ids followed by ``suffix_tokens`` random ids of its own."""
    if min(num_prefixes, prefix_tokens, num_requests) < 1 or suffix_tokens < 0:
        raise ValueError("num_prefixes, prefix_tokens and num_requests must be >= 1, suffix_tokens >= 0")
    prefixes = [_tokens(rng, prefix_tokens, vocab) for _ in range(num_prefixes)]
    out = []
    for i in range(num_requests):
        ids = (*rng.choice(prefixes), *_tokens(rng, suffix_tokens, vocab))
        out.append(RequestSpec(i, ({"role": "user", "content": ""},), max_tokens, len(ids), prompt_ids=ids))
    return out


def conversation_trace(
    rng: random.Random,
    *,
    conversations: int,
    turns: int,
    system_prompts: int,
    system_tokens: int,
    user_tokens: int,
    answer_tokens: int,
    max_tokens: int,
    vocab: tuple[int, int] = (16, 800),
) -> list[RequestSpec]:
    """A Mooncake-style multi-turn trace: ``conversations`` chats, each on one of ``system_prompts``
    shared system prompts, ``turns`` turns each. Turn t's prompt is turn t-1's, plus ``answer_tokens``
    standing in for its answer, plus ``user_tokens`` of new message. Order: turn 0 of every
    conversation (shuffled), then turn 1, ... so a conversation comes back after the others spoke."""
    if min(conversations, turns, system_prompts, system_tokens) < 1:
        raise ValueError("conversations, turns, system_prompts and system_tokens must be >= 1")
    systems = [_tokens(rng, system_tokens, vocab) for _ in range(system_prompts)]
    history = [list(systems[c % system_prompts]) for c in range(conversations)]
    out: list[RequestSpec] = []
    order = list(range(conversations))
    for t in range(turns):
        rng.shuffle(order)
        for c in order:
            if t > 0:
                history[c] += _tokens(rng, answer_tokens, vocab)
            history[c] += _tokens(rng, user_tokens, vocab)
            ids = tuple(history[c])
            out.append(
                RequestSpec(
                    len(out), ({"role": "user", "content": ""},), max_tokens, len(ids), c, t, prompt_ids=ids
                )
            )
    return out
