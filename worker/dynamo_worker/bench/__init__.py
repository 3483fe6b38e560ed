"""Load generator and report for OpenAI-compatible endpoints (``python -m dynamo_worker.bench``).

Point it at any OpenAI-compatible server to put stacks side by side with one workload::

    python -m dynamo_worker.bench --url http://127.0.0.1:8000 --model tiny --concurrency 16 \
        --num-requests 500 --input-len normal:512,128,64,2048 --output-len fixed:128 --json-out a.json
    python -m dynamo_worker.bench --url http://127.0.0.1:8000 --model tiny --mode open --rate 20 \
        --workload shared-prefix --num-prefixes 8 --users-per-prefix 4 --turns 4

The benchmark scenarios of this project (frontend overhead, kv vs round-robin routing, disaggregated
vs aggregated, operator scale) are ``python -m tests.bench.scenarios`` (``make bench``).

``workload`` (what to send, pure), ``stats`` (figures, pure), ``client`` (send and time one request),
``runner`` (closed/open loop with caps), ``run_bench`` here (one run from ``BenchSettings``).
"""

from __future__ import annotations

import random

from dynamo_worker.bench.client import OpenAITarget, make_session
from dynamo_worker.bench.runner import IteratorWorkload, SharedPrefixWorkload, Workload, run_load
from dynamo_worker.bench.settings import BenchSettings
from dynamo_worker.bench.stats import Report, summarize
from dynamo_worker.bench.workload import LengthDist, random_requests, shared_prefix_turns

__all__ = ["BenchSettings", "build_workload", "run_bench"]


def build_workload(s: BenchSettings) -> Workload:
    rng = random.Random(s.seed)
    input_len, output_len = LengthDist.parse(s.input_len), LengthDist.parse(s.output_len)
    if s.workload == "shared-prefix":
        plan = shared_prefix_turns(
            rng,
            num_prefixes=s.num_prefixes,
            users_per_prefix=s.users_per_prefix,
            turns=s.turns,
            prefix_words=s.prefix_len,
            input_len=input_len,
            output_len=output_len,
        )
        return SharedPrefixWorkload(plan, s.seed)
    return IteratorWorkload(random_requests(rng, input_len, output_len))


async def run_bench(s: BenchSettings) -> Report:
    """Warm up (if asked), then one run; the report of the run."""
    async with make_session() as session:
        target = OpenAITarget(
            session,
            s.url,
            s.model,
            api=s.api,
            api_key=s.api_key,
            ignore_eos=s.ignore_eos,
            timeout_s=s.timeout,
        )
        if s.warmup:
            warm = random_requests(
                random.Random(s.seed + 1), LengthDist.parse(s.input_len), LengthDist("fixed", 4)
            )
            await run_load(
                target,
                IteratorWorkload(warm),
                concurrency=s.concurrency,
                num_requests=s.warmup,
                duration_s=s.duration,
                drain_s=s.drain,
            )
        results = await run_load(
            target,
            build_workload(s),
            mode=s.mode,
            concurrency=s.concurrency,
            rate=s.rate,
            num_requests=s.num_requests,
            duration_s=s.duration,
            drain_s=s.drain,
            seed=s.seed,
        )
    return summarize(results)
