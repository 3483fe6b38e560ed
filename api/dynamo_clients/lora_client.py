"""The client of a worker's ``/v1/loras`` (:mod:`dynamo_api.loras`), used by the operator and dynamo-run.

Every call is bounded (``timeout_s``) and answers in one of three ways: done, a ``Refusal`` (the worker
answered and said why), or ``SystemPortUnreachable`` (no answer from the worker's system port: a worker
that is starting, stopping or gone).
:func:`ensure` is the one way an adapter is put on a worker: read what it holds, load what is missing,
reload what came from another source.

Errors::

    LoraClientError
    ├── SystemPortUnreachable   no answer within the bound, or an answer outside the contract
    └── LoraRefused             the worker answered with an error: .refusal (reason, message)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
from dynamo_api.errors import DynamoError
from dynamo_api.loras import (
    LORAS_PATH,
    HeldAdapter,
    Refusal,
    load_body,
    parse_listing,
    parse_refusal,
    same_source,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "LOAD_TIMEOUT_S",
    "EnsureOutcome",
    "LoraClientError",
    "LoraRefused",
    "SystemPortUnreachable",
    "ensure",
    "list_loras",
    "load",
    "unload",
]

DEFAULT_TIMEOUT_S = 5.0
# A load fetches and reads the adapter's files (hf://, s3://) before it answers.
LOAD_TIMEOUT_S = 120.0


class LoraClientError(DynamoError):
    pass


class SystemPortUnreachable(LoraClientError):
    pass


class LoraRefused(LoraClientError):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(f"{refusal.reason}: {refusal.message}")
        self.refusal = refusal


@dataclass(frozen=True)
class EnsureOutcome:
    """What :func:`ensure` found and did on one worker: ``held`` after it, or the worker's refusal."""

    held: bool
    action: Literal["none", "loaded", "reloaded"] = "none"
    refusal: Refusal | None = None


async def _call(
    session: aiohttp.ClientSession, method: str, url: str, timeout_s: float, body: Any = None
) -> tuple[int, Any]:
    try:
        async with session.request(
            method, url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            try:
                answer = await response.json(content_type=None)
            except ValueError:
                answer = (await response.text())[:300]
            return response.status, answer
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SystemPortUnreachable(f"{method} {url}: {type(exc).__name__}: {exc}") from None


async def list_loras(
    session: aiohttp.ClientSession, base_url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, HeldAdapter]:
    """The adapters the worker at ``base_url`` (its system port) holds, by name."""
    status, body = await _call(session, "GET", base_url + LORAS_PATH, timeout_s)
    if status != 200:
        raise LoraRefused(parse_refusal(status, body))
    try:
        return parse_listing(body)
    except ValueError as exc:
        raise SystemPortUnreachable(f"GET {base_url}{LORAS_PATH}: {exc}") from None


async def load(
    session: aiohttp.ClientSession, base_url: str, name: str, uri: str, *, timeout_s: float = LOAD_TIMEOUT_S
) -> None:
    status, body = await _call(session, "POST", base_url + LORAS_PATH, timeout_s, load_body(name, uri))
    if status != 200:
        raise LoraRefused(parse_refusal(status, body))


async def unload(
    session: aiohttp.ClientSession, base_url: str, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """Unload ``name``; False when the worker did not hold it (404)."""
    status, body = await _call(session, "DELETE", f"{base_url}{LORAS_PATH}/{quote(name, safe='')}", timeout_s)
    if status == 404:
        return False
    if status != 200:
        raise LoraRefused(parse_refusal(status, body))
    return True


async def ensure(
    session: aiohttp.ClientSession,
    base_url: str,
    name: str,
    uri: str,
    *,
    load_timeout_s: float = LOAD_TIMEOUT_S,
) -> EnsureOutcome:
    """Make the worker hold ``name`` from ``uri``: nothing when it does, a load when it does not, an
    unload and a load when it holds it from another source. Raises ``SystemPortUnreachable`` (also when
    the load takes longer than ``load_timeout_s``: the worker goes on loading it)."""
    try:
        held = (await list_loras(session, base_url)).get(name)
        if held is not None and same_source(held.uri, uri):
            return EnsureOutcome(held=True)
        if held is not None:
            await unload(session, base_url, name)
        await load(session, base_url, name, uri, timeout_s=load_timeout_s)
    except LoraRefused as exc:
        return EnsureOutcome(held=False, refusal=exc.refusal)
    return EnsureOutcome(held=True, action="reloaded" if held is not None else "loaded")
