"""Profile an engine: ``python -m dynamo_worker.profile --url URL --model NAME --out FILE``.

Sweeps prefill TTFT over input lengths and decode ITL over batch size x context (see ``sweep``),
writes the profile (JSON, ``dynamo_worker.profile.model.Profile``) and, when matplotlib is importable,
a PNG plot beside it (``FILE`` with ``.png``). The mocker loads the file with ``--profile FILE`` and
the planner with ``--profile FILE``.

On a GPU (the 8B shape, one H100; see ``tests/gpu/README.md`` for starting our SGLang worker there):

    python -m dynamo_worker.profile --url http://127.0.0.1:8000 --model <served name> \\
        --gpu H100-SXM-80GB --engine "sglang 0.5.17" --model-label "Llama-3.1-8B shape" \\
        --out sglang-8b-h100.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from dynamo_worker.profile.model import Profile
from dynamo_worker.profile.sweep import Sweeper, SweepError


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if len(values) < 2 or values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"expected at least 2 increasing values, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dynamo_worker.profile", description=__doc__.split("\n")[0])
    p.add_argument(
        "--url",
        required=True,
        help="Frontend root (or, with --target worker, a worker's request plane as host:port).",
    )
    p.add_argument("--target", choices=("frontend", "worker"), default="frontend", help="What --url is.")
    p.add_argument("--model", required=True, help="Served model name.")
    p.add_argument("--out", type=Path, required=True, help="Profile file to write (JSON).")
    p.add_argument(
        "--isl", type=_ints, default=_ints("128,512,1024,2048,4096,8192"), help="Prefill input lengths."
    )
    p.add_argument("--repeats", type=int, default=3, help="Lone requests per input length (median).")
    p.add_argument("--batch", type=_ints, default=_ints("1,8,16,32,64,128"), help="Decode batch sizes.")
    p.add_argument("--context", type=_ints, default=_ints("256,1024,2048,4096"), help="Decode contexts.")
    p.add_argument("--decode-osl", type=int, default=64, help="Output tokens per decode request.")
    p.add_argument("--vocab-max", type=int, default=1000, help="Prompt token ids are drawn below this.")
    p.add_argument("--gpu", default="unknown", help="GPU model, e.g. H100-SXM-80GB.")
    p.add_argument("--gpus-per-replica", type=int, default=1)
    p.add_argument("--engine", default="sglang", help="Engine and version.")
    p.add_argument("--model-label", default=None, help="Model recorded in the file (default: --model).")
    p.add_argument("--source", choices=("measured", "mocker"), default="measured")
    p.add_argument("--note", default="", help="How, where and when it was measured.")
    return p


async def _sweep(a: argparse.Namespace) -> Profile:
    async with aiohttp.ClientSession() as session:
        s = Sweeper(session, a.url, a.model, a.target, vocab=(10, a.vocab_max))
        try:
            prefill = await s.prefill(a.isl, a.repeats)
            print(f"prefill TTFT ms over ISL {a.isl}: {prefill.ttft_ms}", flush=True)
            decode = await s.decode(a.batch, a.context, a.decode_osl)
            for b, row in zip(a.batch, decode.itl_ms, strict=True):
                print(f"decode ITL ms at batch {b} over context {a.context}: {row}", flush=True)
        finally:
            await s.close()
    return Profile(
        model=a.model_label or a.model,
        engine=a.engine,
        gpu=a.gpu,
        gpus_per_replica=a.gpus_per_replica,
        source=a.source,
        note=a.note or f"swept through the {a.target} at {a.url}",
        prefill=prefill,
        decode=decode,
    )


def plot(profile: Profile, path: Path) -> str:
    """Write a PNG of both tables; returns what happened (matplotlib is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot written (pip install matplotlib for one)"
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(profile.prefill.isl, profile.prefill.ttft_ms, marker="o")
    left.set(xlabel="input tokens", ylabel="TTFT (ms)", title="prefill, lone request")
    for j, c in enumerate(profile.decode.context):
        right.plot(
            profile.decode.batch_size, [row[j] for row in profile.decode.itl_ms], marker="o", label=f"ctx {c}"
        )
    right.set(xlabel="batch size", ylabel="ITL (ms)", title="decode")
    right.legend()
    fig.suptitle(f"{profile.model} / {profile.engine} / {profile.gpu} ({profile.source})")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return f"wrote {path}"


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        profile = asyncio.run(_sweep(a))
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    a.out.write_text(profile.model_dump_json(indent=2) + "\n")
    print(f"wrote {a.out}")
    print(plot(profile, a.out.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
