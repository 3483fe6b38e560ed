"""Chat messages with images: processor -> encode worker -> language worker.

For a chat request with ``image_url`` parts the frontend is the processor:

1. Fetch every image: ``data:`` URLs are decoded; ``http(s)`` URLs are fetched with a bound on time
   (``--image-fetch-timeout-s``, redirects included), size (``--max-image-bytes``) and redirects (3),
   and refused when the host resolves to a private, loopback, link-local or otherwise non-public
   address unless ``--allow-private-image-urls`` (checked for every address of every hop, at connect
   time, so a DNS answer cannot change between check and use). Each file must be a PNG, JPEG, GIF or
   WebP image (``multimodal.images.sniff``). Every problem is a 400 naming the part
   (``messages[i].content[j]``) and the fix.
2. Ask an encode worker of the model (round-robin; one retry on another when one cannot be reached)
   for the images' embeddings, sending each file with its sha256 content hash; the worker answers from
   its cache by that hash or computes them.
3. Tokenize the chat as its template rendered it (``requests.chat``: the same plan, messages and
   template as a request without images, each image a ``PLACEHOLDER``) around the placeholders, and
   put ``num_tokens`` pad ids (``protocol.image_pad_id(content_hash)``) where each image goes. The
   ``GenerateRequest`` carries the spans and embeddings (``images``); the pad ids make equal images
   equal token blocks, so the KV router and the workers' prefix caches share them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import ipaddress
import itertools
import socket
import uuid
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes, urljoin, urlparse

import aiohttp
import orjson
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from dynamo_api.errors import DynamoError
from pydantic import ValidationError

from dynamo_worker.frontend.errors import ApiError, InvalidRequest, ServiceUnavailable, UpstreamError
from dynamo_worker.frontend.models.preprocessor import Preprocessor
from dynamo_worker.frontend.models.registry import ModelEntry
from dynamo_worker.multimodal.images import BadImage, content_hash, sniff
from dynamo_worker.multimodal.wire import ENCODE_PATH, EncodeRequest, EncodeResponse, ImageInput
from dynamo_worker.protocol import ImageEmbedding, ImageSpan, InstanceRecord, image_pad_id

__all__ = [
    "PLACEHOLDER",
    "ImageFetcher",
    "MultimodalProcessor",
    "Unreachable",
    "post_to_worker",
]

MAX_REDIRECTS = 3
PLACEHOLDER = "<|dynamo-image|>"  # stands for one image while the chat template renders


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class _PrivateAddress(DynamoError, OSError):
    pass


class _PublicOnlyResolver(AbstractResolver):
    """Resolves as usual, then refuses the host when any of its addresses is not public."""

    def __init__(self) -> None:
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        for r in found:
            if not _public(r["host"]):
                raise _PrivateAddress(f"'{host}' resolves to the non-public address {r['host']}")
        return found

    async def close(self) -> None:
        await self._inner.close()


class ImageFetcher:
    def __init__(self, *, max_bytes: int, timeout_s: float, allow_private: bool) -> None:
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.allow_private = allow_private
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            resolver = None if self.allow_private else _PublicOnlyResolver()
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(resolver=resolver, limit=64),
                timeout=aiohttp.ClientTimeout(total=None),
                headers={"User-Agent": "dynamo-frontend"},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _too_big(self, param: str, what: str) -> InvalidRequest:
        return InvalidRequest(
            f"The image {what} is larger than this server's limit of {self.max_bytes} bytes "
            "(--max-image-bytes); send a smaller image.",
            param=param,
            code="image_too_large",
        )

    async def fetch(self, url: str, param: str) -> bytes:
        if url.startswith("data:"):
            return self._data_url(url, param)
        scheme = urlparse(url).scheme
        if scheme not in ("http", "https"):
            raise InvalidRequest(
                f"An image URL must be a data: URL or an http(s) URL, not '{scheme or url[:32]}'.",
                param=param,
                code="invalid_image_url",
            )
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._fetch_http(url, param)
        except TimeoutError:
            raise InvalidRequest(
                f"Fetching the image at {url} took longer than {self.timeout_s:g}s "
                "(--image-fetch-timeout-s); "
                "send it as a data: URL or from a faster host.",
                param=param,
                code="image_fetch_timeout",
            ) from None

    def _data_url(self, url: str, param: str) -> bytes:
        header, sep, payload = url[5:].partition(",")
        if not sep:
            raise InvalidRequest(
                "The data: URL has no ',' before its data; use data:image/png;base64,<data>.",
                param=param,
                code="invalid_image_url",
            )
        if len(payload) * 3 // 4 > self.max_bytes:
            raise self._too_big(param, "in the data: URL")
        if header.endswith(";base64"):
            try:
                return base64.b64decode(payload, validate=True)
            except binascii.Error:
                raise InvalidRequest(
                    "The data: URL's base64 data is not valid base64.", param=param, code="invalid_image_url"
                ) from None
        return unquote_to_bytes(payload)

    def _check_literal(self, url: str, param: str) -> None:
        host = urlparse(url).hostname or ""
        with contextlib.suppress(ValueError):
            if not self.allow_private and not _public(host):
                raise self._private(url, f"{host} is not a public address", param)

    def _private(self, url: str, why: str, param: str) -> InvalidRequest:
        return InvalidRequest(
            f"The image URL {url} is refused: {why}. Images are fetched only from public addresses "
            "(an operator may allow private ones with --allow-private-image-urls); or send a data: URL.",
            param=param,
            code="image_url_not_allowed",
        )

    async def _fetch_http(self, url: str, param: str) -> bytes:
        session = self._get_session()
        for _ in range(MAX_REDIRECTS + 1):
            self._check_literal(url, param)
            try:
                async with session.get(url, allow_redirects=False) as resp:
                    if resp.status in (301, 302, 303, 307, 308) and "Location" in resp.headers:
                        url = urljoin(url, resp.headers["Location"])
                        continue
                    if resp.status != 200:
                        raise InvalidRequest(
                            f"Fetching the image at {url} answered HTTP {resp.status}; check the URL.",
                            param=param,
                            code="image_fetch_failed",
                        )
                    if (resp.content_length or 0) > self.max_bytes:
                        raise self._too_big(param, f"at {url} ({resp.content_length} bytes)")
                    body = bytearray()
                    async for block in resp.content.iter_chunked(64 * 1024):
                        body += block
                        if len(body) > self.max_bytes:
                            raise self._too_big(param, f"at {url}")
                    return bytes(body)
            except aiohttp.ClientConnectorError as e:
                if isinstance(e.os_error, _PrivateAddress):
                    raise self._private(url, str(e.os_error), param) from None
                raise InvalidRequest(
                    f"Could not connect to fetch the image at {url} ({e.os_error}); check the URL.",
                    param=param,
                    code="image_fetch_failed",
                ) from None
            except aiohttp.ClientError as e:
                raise InvalidRequest(
                    f"Fetching the image at {url} failed ({type(e).__name__}: {e}); check the URL.",
                    param=param,
                    code="image_fetch_failed",
                ) from None
        raise InvalidRequest(
            f"The image URL redirected more than {MAX_REDIRECTS} times; send the final URL.",
            param=param,
            code="image_fetch_failed",
        )


@dataclass(frozen=True)
class _Image:
    param: str
    data: bytes
    content_hash: str


class MultimodalProcessor:
    def __init__(
        self,
        fetcher: ImageFetcher,
        *,
        max_images: int,
        connect_timeout_s: float,
        encode_timeout_s: float,
    ) -> None:
        self.fetcher = fetcher
        self.max_images = max_images
        self.connect_timeout_s = connect_timeout_s
        self.encode_timeout_s = encode_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._turn = itertools.count()

    async def close(self) -> None:
        await self.fetcher.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def prompt_ids(
        self, entry: ModelEntry, pre: Preprocessor, rendered: str, images: list[tuple[str, str]]
    ) -> tuple[list[int], list[ImageSpan]]:
        """The prompt's token ids, with each image's pad ids where ``rendered`` (the chat as its template
        rendered it) has ``PLACEHOLDER``, and the image spans; ``images``: (param, URL) of each image in
        order (``requests.chat.image_urls``)."""
        if len(images) > self.max_images:
            raise InvalidRequest(
                f"The request has {len(images)} images; this server takes at most {self.max_images} "
                "per request (--max-images-per-request). Send fewer.",
                param="messages",
                code="too_many_images",
            )
        encoders = entry.by_role("encode")
        if not encoders:
            raise ServiceUnavailable(
                f"Model '{entry.name}' has no encode worker, so it cannot take images. Start (or wait for) a "
                "worker with --role encode for it, or send text only.",
                code="no_encode_workers",
            )
        pieces = rendered.split(PLACEHOLDER)
        if len(pieces) != len(images) + 1:
            raise InvalidRequest(
                f"The model's chat template kept {len(pieces) - 1} of the {len(images)} images (it drops "
                "content of some messages); put the images in user messages.",
                param="messages",
                code="chat_template_error",
            )
        files = await asyncio.gather(*(self.fetcher.fetch(url, param) for param, url in images))
        checked = []
        for (param, _), data in zip(images, files, strict=True):
            try:
                sniff(data)
            except BadImage as e:
                raise InvalidRequest(
                    f"The image is not usable: {e}. Send a PNG, JPEG, GIF or WebP file.",
                    param=param,
                    code="invalid_image",
                ) from None
            checked.append(_Image(param, data, content_hash(data)))
        embeddings = await self._encode(encoders, entry.name, checked)
        encoded = await asyncio.to_thread(pre.tokenizer.encode_batch, pieces, add_special_tokens=False)
        ids: list[int] = list(encoded[0].ids)
        spans = []
        for emb, piece in zip(embeddings, encoded[1:], strict=True):
            spans.append(ImageSpan(offset=len(ids), embedding=emb))
            ids += [image_pad_id(emb.content_hash)] * emb.num_tokens
            ids += piece.ids
        return ids, spans

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def _encode(
        self, encoders: list[InstanceRecord], model: str, images: list[_Image]
    ) -> list[ImageEmbedding]:
        request = EncodeRequest(
            request_id=uuid.uuid4().hex,
            model=model,
            images=[
                ImageInput(content_hash=i.content_hash, data=base64.b64encode(i.data).decode())
                for i in images
            ],
        )
        body = request.model_dump_json()
        start = next(self._turn)
        failure: ApiError | None = None
        for attempt in range(min(2, len(encoders))):
            worker = encoders[(start + attempt) % len(encoders)]
            try:
                return await self._post(worker, body, len(images))
            except Unreachable as e:
                failure = e.error
        assert failure is not None
        raise failure

    async def _post(self, worker: InstanceRecord, body: str, count: int) -> list[ImageEmbedding]:
        payload = await post_to_worker(
            self._get_session(),
            worker,
            ENCODE_PATH,
            body,
            role="encode",
            connect_timeout_s=self.connect_timeout_s,
            timeout_s=self.encode_timeout_s,
        )
        try:
            answer = EncodeResponse.model_validate_json(payload)
        except ValidationError as e:
            raise UpstreamError(f"The encode worker at {worker.address} answered nonsense: {e}") from None
        if len(answer.embeddings) != count:
            raise UpstreamError(
                f"The encode worker at {worker.address} answered {len(answer.embeddings)} embeddings "
                f"for {count} images.",
                code="upstream_error",
            )
        return answer.embeddings


async def post_to_worker(
    session: aiohttp.ClientSession,
    worker: InstanceRecord,
    path: str,
    body: str,
    *,
    role: str,
    connect_timeout_s: float,
    timeout_s: float,
) -> bytes:
    """POST ``body`` (JSON) to a worker's endpoint; its 200 answer, or the client's error
    (``Unreachable`` wraps one that another worker of the role may not have)."""
    url = f"http://{worker.address}{path}"
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect_timeout_s)
    try:
        async with session.post(
            url, data=body, headers={"Content-Type": "application/json"}, timeout=timeout
        ) as resp:
            payload = await resp.read()
            if resp.status != 200:
                raise _worker_error(resp.status, payload, worker.address, role)
            return payload
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as e:
        raise Unreachable(
            UpstreamError(
                f"The {role} worker at {worker.address} could not be reached: {e}", code="worker_unreachable"
            )
        ) from None
    except TimeoutError:
        raise UpstreamError(
            f"The {role} worker at {worker.address} did not answer within {timeout_s:g}s.",
            code="worker_timeout",
        ) from None
    except aiohttp.ClientError as e:
        raise UpstreamError(
            f"The {role} worker at {worker.address} failed: {type(e).__name__}: {e}", code="upstream_error"
        ) from None


class Unreachable(DynamoError):
    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


def _worker_error(status: int, payload: bytes, address: str, role: str) -> ApiError:
    try:
        error = orjson.loads(payload)["error"]
        kind, message = str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        kind, message = "engine_error", payload[:200].decode(errors="replace")
    if status == 400:
        return InvalidRequest(f"The {role} worker refused the request: {message}", code="invalid_request")
    if status == 503:
        return ServiceUnavailable(
            f"The {role} worker is {kind.replace('_', ' ')}: {message}",
            code=kind,
            headers={"Retry-After": "1"},
        )
    return UpstreamError(f"The {role} worker at {address} failed ({kind}): {message}", code=kind)
