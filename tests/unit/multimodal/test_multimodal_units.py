"""The pure parts of the multimodal roles: image sniffing (format, size, corruption) for the formats
OpenAI accepts; the embedding cache's LRU bound and hit/miss counts; the wire rule that image spans lie
inside the prompt without overlapping; pad ids that differ between images; which addresses count as
public for image URLs; and deterministic mocker embeddings and PNGs."""

from __future__ import annotations

import base64
import struct

import pytest
from dynamo_worker.frontend.requests.chat_images import _public
from dynamo_worker.mocker.multimodal import MockEncoder, image_grid
from dynamo_worker.multimodal.cache import EmbeddingCache
from dynamo_worker.multimodal.images import BadImage, content_hash, sniff, write_png
from dynamo_worker.protocol import GenerateRequest, ImageEmbedding, StopConditions, image_pad_id
from prometheus_client import CollectorRegistry
from pydantic import ValidationError


def embedding(seed: int, tokens: int = 2, hidden: int = 3) -> ImageEmbedding:
    data = base64.b64encode(bytes(tokens * hidden * 2)).decode()
    return ImageEmbedding(
        content_hash=content_hash(bytes([seed])), num_tokens=tokens, hidden_size=hidden, dtype="float16",
        width=8, height=8, data=data,
    )  # fmt: skip


def test_sniff_reads_png_jpeg_gif_and_webp_sizes():
    assert sniff(write_png(7, 5, bytes(7 * 5 * 3))) == sniff(write_png(7, 5, bytes(105)))
    assert (sniff(write_png(7, 5, bytes(105))).width, sniff(write_png(7, 5, bytes(105))).height) == (7, 5)
    jpeg = (
        b"\xff\xd8\xff\xe0"
        + struct.pack(">H", 16)
        + bytes(14)
        + b"\xff\xc0"
        + struct.pack(">HBHH", 17, 8, 30, 40)
    )
    assert (sniff(jpeg).format, sniff(jpeg).width, sniff(jpeg).height) == ("jpeg", 40, 30)
    gif = b"GIF89a" + struct.pack("<HH", 12, 34) + bytes(8)
    assert (sniff(gif).width, sniff(gif).height) == (12, 34)
    webp = (
        b"RIFF" + bytes(4) + b"WEBPVP8X" + bytes(8) + (99).to_bytes(3, "little") + (49).to_bytes(3, "little")
    )
    assert (sniff(webp).width, sniff(webp).height) == (100, 50)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"hello", "not a PNG, JPEG, GIF or WebP"),
        (write_png(4, 4, bytes(48))[:30], "truncated"),
        (b"\xff\xd8\xff\xe0\x00\x04ab", "truncated"),
        (b"GIF89a" + struct.pack("<HH", 0, 5), "no pixels"),
        (b"GIF89a" + struct.pack("<HH", 65535, 65535), "more than"),
    ],
)
def test_sniff_refuses_what_is_not_a_usable_image(data, words):
    with pytest.raises(BadImage, match=words):
        sniff(data)


def test_a_png_with_a_damaged_chunk_is_refused():
    damaged = bytearray(write_png(16, 16, bytes(768)))
    damaged[45] ^= 0x55
    with pytest.raises(BadImage, match="bad CRC"):
        sniff(bytes(damaged))


def test_cache_evicts_least_recently_used_within_its_bytes_and_counts_hits():
    registry = CollectorRegistry()
    one = len(embedding(0).data)
    cache = EmbeddingCache(max_bytes=2 * one, registry=registry)
    a, b, c = embedding(1), embedding(2), embedding(3)
    cache.put(a)
    cache.put(b)
    assert cache.get(a.content_hash) == a  # a is now the most recent
    cache.put(c)  # evicts b
    assert cache.get(b.content_hash) is None and cache.get(c.content_hash) == c
    assert cache.bytes == 2 * one and len(cache) == 2
    value = registry.get_sample_value
    assert (value("dynamo_encode_cache_hits_total"), value("dynamo_encode_cache_misses_total")) == (2, 1)
    assert value("dynamo_encode_cache_evictions_total") == 1
    cache.put(embedding(4, tokens=100))  # larger than the whole cache: not kept, nothing evicted
    assert len(cache) == 2


def test_image_spans_must_lie_inside_the_prompt_without_overlapping():
    e = embedding(1)
    base = {"request_id": "r", "model": "m", "stop": StopConditions(max_tokens=1)}
    GenerateRequest(token_ids=[1, 9, 9, 2], images=[{"offset": 1, "embedding": e}], **base)
    for offsets in ([3], [0, 1]):
        with pytest.raises(ValidationError, match="overlaps another image or lies outside"):
            GenerateRequest(
                token_ids=[1, 9, 9, 2], images=[{"offset": o, "embedding": e} for o in offsets], **base
            )
    with pytest.raises(ValidationError, match="base64 of 12 bytes"):
        ImageEmbedding(**(e.model_dump() | {"data": "AAAA"}))


def test_pad_ids_differ_between_images_and_stay_below_2_30():
    pads = {image_pad_id(content_hash(bytes([i]))) for i in range(200)}
    assert len(pads) == 200 and max(pads) < 2**30


@pytest.mark.parametrize(
    ("address", "public"),
    [("8.8.8.8", True), ("127.0.0.1", False), ("10.1.2.3", False), ("169.254.169.254", False),
     ("::1", False), ("::ffff:10.0.0.1", False), ("2001:4860:4860::8888", True), ("100.64.0.1", False)],
)  # fmt: skip
def test_public_addresses(address, public):
    assert _public(address) is public


async def test_mock_embeddings_are_deterministic_and_follow_the_image_grid():
    encoder = MockEncoder("m", hidden_size=8, max_tokens=16, base_ms=0, per_token_us=0, speedup=1)
    png = write_png(100, 60, bytes(100 * 60 * 3))
    item = (content_hash(png), png, sniff(png))
    first, again = await encoder.encode([item]), await encoder.encode([item])
    assert first == again
    assert (first[0].num_tokens, first[0].grid_thw) == (4 * 3, (1, 6, 8))
    assert image_grid(1000, 1000, 16) == (4, 4)  # scaled down to at most max_tokens


def test_role_flags_including_nvidia_dynamos_spellings():
    from dynamo_worker.mocker.settings import parse_all
    from dynamo_worker.runtime.settings import SettingsError

    def role(*argv: str) -> str:
        return parse_all(list(argv), env={})[2].worker_role

    assert role() == "language"
    assert role("--role", "encode") == role("--multimodal-encode-worker") == "encode"
    assert role("--role", "diffusion") == role("--image-diffusion-worker") == "diffusion"
    assert role("--multimodal-worker") == "language"
    with pytest.raises(SettingsError, match="one role per worker"):
        parse_all(["--role", "diffusion", "--multimodal-encode-worker"], env={})
