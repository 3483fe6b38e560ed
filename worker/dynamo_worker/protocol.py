"""Wire models shared by every role: what a frontend sends a worker, and what a worker streams back.

Transport (the request plane, ``runtime.request_plane``): the frontend sends each ``GenerateRequest``
as JSON over its one connection to ``<instance.address>``, and the worker streams ``GenerateChunk``s
back on the same connection. Chunks carry *disjoint* token ids (each id once, in order). The last
chunk has ``finish_reason`` set and ``usage``; a failure is a last chunk with ``finish_reason="error"``
and ``error`` set. Cancelling the stream (or closing the connection) cancels the request on the worker.

Optional request features (all default off, so a plain request is unchanged on the wire):
``structured`` constrains decoding to a grammar (SGLang's ``json_schema`` / ``regex`` / ``ebnf`` /
``structural_tag`` sampling parameters); ``logprobs`` asks for each output token's log probability and
that many alternatives, returned per chunk aligned with ``token_ids``; ``embed`` turns the request into
an embedding request (served by workers whose model card says ``model_type="embedding"``): the
worker then streams the vectors in input order, as base64 little-endian float32 (``pack_vector``),
a few per chunk so that no line grows past what a reader buffers, the last chunk with
``finish_reason`` and ``usage``; no token ids.

Discovery records (``InstanceRecord``) and event-plane messages (``KvEventBatch``, ``LoadMetrics``)
are defined here too, so a frontend, a router and every kind of worker agree on one definition.

Rolling upgrades: what a peer *tells* (discovery records, model cards, KV events and snapshots, load
metrics, the chunks of an answer) ignores fields it does not know, so an older frontend or router reads
a newer worker's messages and a mixed fleet keeps serving; new fields always have defaults, so a newer
reader reads an older peer's too. What a peer is *asked to do* (``GenerateRequest``) refuses unknown
fields: a worker that does not know a field cannot honour it, and serving the request without it would
answer a different request than the one sent.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Sequence
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROTOCOL_VERSION: Final = 1
MAX_ROOM = 2**63 - 1
LORA_NAME_MAX = 256
STREAM_INTERVAL_MAX = 1024

Role = Literal["agg", "prefill", "decode", "encode", "diffusion"]
LANGUAGE_ROLES = ("agg", "prefill", "decode")  # roles that serve GenerateRequests
FinishReason = Literal["stop", "length", "cancelled", "error"]
ErrorType = Literal[
    "invalid_request",  # the worker cannot serve this request as asked (the caller's fault)
    "overloaded",  # the worker refuses new work now; try another or later
    "bootstrap_timeout",  # a prefill/decode leg waited for its peer longer than its bound
    "bootstrap_failed",  # the KV transfer between the legs failed
    "engine_error",  # the engine failed while serving the request
    "shutting_down",  # the worker is draining and takes no new work
    "engine_died",  # the worker's engine died under it: continue the request on another worker
]


class _Wire(BaseModel):
    """What a peer is asked to do: an unknown field is refused (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _Told(BaseModel):
    """What a peer tells: an unknown field (a newer peer's) is ignored (see the module docstring)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class SamplingOptions(_Wire):
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = -1  # -1: disabled
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    seed: int | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0

    @model_validator(mode="after")
    def _top_k_not_zero(self) -> SamplingOptions:
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (disabled) or at least 1")
        return self


class StopConditions(_Wire):
    max_tokens: Annotated[int, Field(ge=1)]
    min_tokens: Annotated[int, Field(ge=0)] = 0
    stop_token_ids: list[int] = Field(default_factory=list)  # ends generation; the id is not returned
    ignore_eos: bool = False


class BootstrapInfo(_Wire):
    """Where a decode leg fetches the KV cache a prefill leg computes for the same room."""

    bootstrap_host: str
    bootstrap_port: Annotated[int, Field(ge=1, le=65535)]
    bootstrap_room: Annotated[int, Field(ge=0, le=MAX_ROOM)]


class StructuredOutput(_Wire):
    """The grammar decoding must follow: exactly one of the four (SGLang's names and formats)."""

    json_schema: str | None = None  # a JSON schema, as JSON text
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None  # SGLang's structural tag, as JSON text

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutput:
        if sum(v is not None for v in (self.json_schema, self.regex, self.ebnf, self.structural_tag)) != 1:
            raise ValueError("exactly one of json_schema, regex, ebnf, structural_tag must be set")
        return self


class EmbedOptions(_Wire):
    """An embedding request: one vector per input (``token_ids`` repeats the first input for routers)."""

    inputs: Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    dimensions: Annotated[int, Field(ge=1)] | None = None  # Matryoshka truncation, where the model allows


class GenerateRequest(_Wire):
    version: Literal[1] = PROTOCOL_VERSION
    request_id: Annotated[str, Field(min_length=1, max_length=128)]
    model: str
    token_ids: Annotated[list[int], Field(min_length=1)]
    sampling: SamplingOptions = SamplingOptions()
    stop: StopConditions
    eos_token_ids: list[int] = Field(default_factory=list)
    bootstrap_info: BootstrapInfo | None = None
    data_parallel_rank: Annotated[int, Field(ge=0)] | None = None
    structured: StructuredOutput | None = None
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None  # None: none; k: chosen + k top
    embed: EmbedOptions | None = None
    # Multimodal: each image's span of ``token_ids`` and the embeddings that replace it (see below).
    images: list[ImageSpan] = Field(default_factory=list)
    # The LoRA adapter to generate with (its name on the worker, ``/v1/loras``); None: the base model.
    lora_name: Annotated[str, Field(min_length=1, max_length=LORA_NAME_MAX)] | None = None
    # Hand the tokens over every ``stream_interval`` decode steps, not at every step (SGLang's per-request
    # ``stream_interval``): the first token at once, then each time ``stream_interval`` more are ready, and
    # the rest at the end. The frontend sets it for a client that reads only the whole answer; it changes
    # no token, only how often a chunk crosses the engine's and the request plane's process boundaries.
    # Sent only to workers whose record says ``takes_stream_interval`` (an older one would refuse it).
    stream_interval: Annotated[int, Field(ge=1, le=STREAM_INTERVAL_MAX)] | None = None

    @model_validator(mode="after")
    def _embed_first_input(self) -> GenerateRequest:
        if self.embed is not None and self.embed.inputs[0] != self.token_ids:
            raise ValueError("token_ids must equal embed.inputs[0] in an embedding request")
        return self

    @model_validator(mode="after")
    def _image_spans_fit(self) -> GenerateRequest:
        end = 0
        for i, span in enumerate(self.images):
            if span.offset < end or span.offset + span.embedding.num_tokens > len(self.token_ids):
                raise ValueError(f"images[{i}] overlaps another image or lies outside token_ids")
            end = span.offset + span.embedding.num_tokens
        return self


class Usage(_Told):
    prompt_tokens: Annotated[int, Field(ge=0)]
    completion_tokens: Annotated[int, Field(ge=0)]
    cached_tokens: Annotated[int, Field(ge=0)] = 0  # prompt tokens not computed: found in any KV tier
    # Of ``cached_tokens``, those loaded back from host memory or storage (SGLang's HiCache) rather than
    # found on the GPU (SGLang's ``cached_tokens_details`` host + storage).
    cached_tokens_host: Annotated[int, Field(ge=0)] = 0


class WorkerError(_Told):
    type: ErrorType
    message: str


class TopLogprob(_Told):
    token_id: int
    logprob: float


class TokenLogprob(_Told):
    """One output token's log probability and the ``logprobs`` most likely alternatives."""

    token_id: int
    logprob: float
    top: list[TopLogprob] = Field(default_factory=list)


class GenerateChunk(_Told):
    token_ids: list[int] = Field(default_factory=list)
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: WorkerError | None = None
    logprobs: list[TokenLogprob] | None = None  # aligned with token_ids, when the request asked
    embeddings: list[str] | None = None  # embedding request: vectors in input order (``pack_vector``)

    @model_validator(mode="after")
    def _error_iff_error_finish(self) -> GenerateChunk:
        if (self.finish_reason == "error") != (self.error is not None):
            raise ValueError("error is set exactly when finish_reason is 'error'")
        return self


class ServingFeatures(_Told):
    """What a worker's model serves beyond plain generation, published in its model card.

    ``model_type``: ``generate`` (chat and completions) or ``embedding`` (``/v1/embeddings`` only).
    ``tool_call_parser`` / ``reasoning_parser``: SGLang's parser names the frontend applies to outputs.
    ``grammar_backend``: the engine's constrained-decoding backend; ``"none"`` refuses structured output.
    ``embedding_dim`` / ``matryoshka_dimensions``: the vector size, and the sizes ``dimensions`` may ask
    for (None: any size up to ``embedding_dim`` when the model is Matryoshka, else none)."""

    model_type: Literal["generate", "embedding"] = "generate"
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    grammar_backend: str | None = None
    embedding_dim: Annotated[int, Field(ge=1)] | None = None
    is_matryoshka: bool = False
    matryoshka_dimensions: list[int] | None = None


MAX_EMBEDDING_CHUNK_BYTES = 48 * 1024  # vectors per chunk: at most this much base64 (and at least one)


def pack_vector(vector: Sequence[float]) -> str:
    """A vector on the wire: base64 of little-endian float32 (OpenAI's ``encoding_format=base64``)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def unpack_vector(packed: str) -> list[float]:
    data = base64.b64decode(packed)
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def embedding_chunks(vectors: Sequence[Sequence[float]], usage: Usage) -> list[GenerateChunk]:
    """The chunks a worker streams for an embedding request's ``vectors``."""
    packed = [pack_vector(v) for v in vectors]
    chunks: list[GenerateChunk] = []
    group: list[str] = []
    size = 0
    for p in packed:
        if group and size + len(p) > MAX_EMBEDDING_CHUNK_BYTES:
            chunks.append(GenerateChunk(embeddings=group))
            group, size = [], 0
        group.append(p)
        size += len(p)
    chunks.append(GenerateChunk(embeddings=group, finish_reason="stop", usage=usage))
    return chunks


# --- discovery ----------------------------------------------------------------------------------


class LoraAdapter(_Told):
    """A LoRA adapter a worker holds (loaded through ``/v1/loras`` or ``--lora-paths``)."""

    name: Annotated[str, Field(min_length=1, max_length=LORA_NAME_MAX)]
    uri: str  # where it was loaded from: file:///..., hf://org/repo[@rev]
    rank: Annotated[int, Field(ge=1)] | None = None
    pinned: bool = False


class LoraState(_Told):
    """What a LoRA-enabled worker publishes in discovery: the adapters it holds and its slots.

    ``max_loras_per_batch``: distinct adapters one batch runs (the base model counts as one, as in
    SGLang); ``max_loaded_loras``: adapters it may hold at once (None: no limit); ``free_slots``: how
    many more it can load before it must evict one (None: no limit); ``cannot_load``: why it can load
    no adapter at all, and the fix (None: it can; SGLang under ``--load-format dummy`` cannot)."""

    adapters: list[LoraAdapter] = Field(default_factory=list)
    max_loras_per_batch: Annotated[int, Field(ge=1)] = 8
    max_loaded_loras: Annotated[int, Field(ge=1)] | None = None
    max_lora_rank: Annotated[int, Field(ge=1)] | None = None
    cannot_load: str | None = None

    @property
    def free_slots(self) -> int | None:
        if self.max_loaded_loras is None:
            return None
        return max(self.max_loaded_loras - len(self.adapters), 0)

    def holds(self, name: str) -> bool:
        return any(a.name == name for a in self.adapters)


class InstanceRecord(_Told):
    """What a worker registers in discovery, renewed by its heartbeat while it lives."""

    instance_id: Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
    namespace: str
    component: str
    endpoint: str = "generate"
    role: Role
    model: str  # the served model name clients ask for
    address: str  # host:port of the request plane
    page_size: Annotated[int, Field(ge=1)]
    total_kv_blocks: Annotated[int, Field(ge=0)]
    max_running_requests: Annotated[int, Field(ge=1)] | None = None
    bootstrap_host: str | None = None
    bootstrap_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    dp_size: Annotated[int, Field(ge=1)] = 1
    model_card_checksum: str | None = None  # key of the ModelCard in the object store
    # What fixes the KV layout and the model (``runtime.worker.worker_revision``): a prefill and a
    # decode worker are paired only when their revisions are equal (``frontend.models.pairing``).
    revision: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    started_at: float | None = None  # unix time the worker started: orders revisions, newest first
    # LoRA: None when the worker runs without --enable-lora; rewritten as soon as adapters change.
    lora: LoraState | None = None
    # Whether its ``GenerateRequest`` knows ``stream_interval`` (False: an older worker's record).
    takes_stream_interval: bool = False
    version: Literal[1] = PROTOCOL_VERSION


# --- event plane --------------------------------------------------------------------------------


# Where a KV block is held (``BlockStored`` / ``BlockRemoved``): the GPU's KV pool, host memory
# (SGLang's HiCache, ``--enable-hierarchical-cache``), or HiCache's storage tier. A block may be held in
# several at once (a host backup of a GPU block); see ``router.index`` for what each event means.
Medium = Literal["gpu", "host", "disk"]
MEDIA: tuple[Medium, ...] = ("gpu", "host", "disk")


class BlockStored(_Told):
    type: Literal["stored"] = "stored"
    parent_hash: int | None  # None: the blocks start at the beginning of a sequence
    block_hashes: list[int]  # the engine's hashes, in sequence order
    token_ids: list[int]  # len(block_hashes) * page_size tokens, the content of those blocks
    medium: Medium = "gpu"  # the tier the blocks are now (also) held in
    lora_name: str | None = None  # the adapter whose prefix cache holds them (None: the base model)


class BlockRemoved(_Told):
    type: Literal["removed"] = "removed"
    block_hashes: list[int]
    medium: Medium = "gpu"  # the tier the blocks left (they may still be held in another)


class AllBlocksCleared(_Told):
    type: Literal["cleared"] = "cleared"


KvEvent = Annotated[BlockStored | BlockRemoved | AllBlocksCleared, Field(discriminator="type")]


class KvEventBatch(_Told):
    """KV cache events of one worker. ``seq`` grows by one per batch; a gap means events were lost.
    A data-parallel engine's batch holds the events of one attention dp rank, ``dp_rank``."""

    instance_id: str
    seq: Annotated[int, Field(ge=0)]
    events: list[KvEvent]
    dp_rank: Annotated[int, Field(ge=0)] = 0


class KvSnapshotRequest(_Told):
    """Asks one worker for the blocks it holds (``kv_snapshot_subject``); sent with a reply inbox."""

    requester: str = ""  # for the worker's log only


class KvSnapshotPart(_Told):
    """One part of a worker's answer to ``KvSnapshotRequest``: the blocks it has published as stored
    and not removed, as ``BlockStored`` events (parents before children, one per tier a block is
    held in, each with its ``medium``) per dp rank. ``next_seq`` is
    the ``seq`` of the first event batch *not* included: batches below it are already in the snapshot.
    Large snapshots come in several parts, numbered ``part`` = 0, 1, ... and the last with ``last``."""

    instance_id: str
    next_seq: Annotated[int, Field(ge=0)]
    part: Annotated[int, Field(ge=0)] = 0
    last: bool = True
    dp_rank: Annotated[int, Field(ge=0)] = 0
    events: list[BlockStored] = Field(default_factory=list)


class LoadMetrics(_Told):
    """One worker's load as its engine reports it (summed over its dp ranks), published when it changes
    (``runtime.events.LoadPublisher``). ``waiting`` counts every request queued in the engine (for a
    prefill worker its bootstrap queue too, for a decode worker its prealloc and transfer queues).
    Fields after ``running`` came later: an older worker's report leaves them 0."""

    instance_id: str
    active_blocks: Annotated[int, Field(ge=0)]  # KV blocks in use
    total_blocks: Annotated[int, Field(ge=0)]
    waiting: Annotated[int, Field(ge=0)]
    running: Annotated[int, Field(ge=0)]
    # prompt tokens queued for prefill compute (uncached; a prefill worker's bootstrap queue counts whole)
    waiting_prefill_tokens: Annotated[int, Field(ge=0)] = 0
    # disaggregation: a prefill worker's requests waiting for their decode leg's handshake (bootstrap)
    # and sending their KV (transfer); a decode worker's requests waiting for KV memory or the handshake
    # (prealloc) and receiving their KV (transfer)
    bootstrap_queue: Annotated[int, Field(ge=0)] = 0
    prealloc_queue: Annotated[int, Field(ge=0)] = 0
    transfer_queue: Annotated[int, Field(ge=0)] = 0


def kv_events_subject(namespace: str) -> str:
    return f"dynamo.{namespace}.kv_events"


def load_subject(namespace: str) -> str:
    return f"dynamo.{namespace}.load"


def kv_snapshot_subject(namespace: str, instance_id: str) -> str:
    return f"dynamo.{namespace}.kv_snapshot.{instance_id}"


# --- block hashing ------------------------------------------------------------------------------


def lora_seed(lora_name: str) -> int:
    """The parent hash an adapter's first block chains from: the adapter's prefix cache is a namespace
    of its own, keyed on its name (never on an engine's per-load id), so the same adapter prefix hashes
    alike on every worker and after a reload."""
    digest = hashlib.blake2b(b"lora\0" + lora_name.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") & MAX_ROOM) or 1


def hash_token_blocks(
    token_ids: Sequence[int], page_size: int, parent: int | None = None, *, lora_name: str | None = None
) -> list[int]:
    """Chained hashes of the full ``page_size`` blocks of ``token_ids`` (a trailing partial block is
    not hashed). Block i's hash covers its parent's hash and its own tokens, so equal hashes mean equal
    prefixes. Stable across processes and machines (no Python ``hash``), 63-bit non-negative ints.
    Blocks that start a sequence (``parent`` None) of a LoRA adapter chain from ``lora_seed``, so they
    never equal the base model's blocks or another adapter's."""
    hashes: list[int] = []
    seed = lora_seed(lora_name) if lora_name is not None else 0
    prev = parent if parent is not None else seed
    full = len(token_ids) // page_size * page_size
    # the tokens packed once (each block's bytes a slice), as struct.pack("<q{page_size}I", prev, *block)
    packed, width = struct.pack(f"<{full}I", *token_ids[:full]), 4 * page_size
    for start in range(0, 4 * full, width):
        data = _PARENT.pack(prev) + packed[start : start + width]
        prev = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & MAX_ROOM
        hashes.append(prev)
    return hashes


_PARENT = struct.Struct("<q")


# --- multimodal ---------------------------------------------------------------------------------


class ImageEmbedding(_Wire):
    """One image's embeddings as an encode worker computed them: ``num_tokens`` rows of ``hidden_size``
    values of ``dtype``, little-endian, row-major, base64 in ``data``. ``grid_thw`` is the vision
    encoder's patch grid (temporal, height, width) for models whose positions depend on it (Qwen2-VL's
    M-RoPE); ``content_hash`` (sha256 of the image file's bytes, hex) names the image everywhere: the
    encode worker's cache, the pad token ids the KV router hashes, the language worker."""

    content_hash: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    num_tokens: Annotated[int, Field(ge=1)]
    hidden_size: Annotated[int, Field(ge=1)]
    dtype: Literal["float16", "bfloat16", "float32"]
    grid_thw: tuple[int, int, int] | None = None
    width: Annotated[int, Field(ge=1)]
    height: Annotated[int, Field(ge=1)]
    data: str

    @model_validator(mode="after")
    def _data_size(self) -> ImageEmbedding:
        size = self.num_tokens * self.hidden_size * (4 if self.dtype == "float32" else 2)
        if len(self.data) != 4 * ((size + 2) // 3):
            raise ValueError(f"data must be base64 of {size} bytes (num_tokens x hidden_size x dtype)")
        return self


class ImageSpan(_Wire):
    """An image in a prompt: ``token_ids[offset : offset + embedding.num_tokens]`` are its pad ids
    (``image_pad_id(content_hash)``), which the language worker replaces by ``embedding``."""

    offset: Annotated[int, Field(ge=0)]
    embedding: ImageEmbedding


# GenerateRequest names ImageSpan before it is defined: build its validator now, at import, not on the
# first request a process handles (tens of milliseconds that a first request would otherwise wait for).
GenerateRequest.model_rebuild()


def image_pad_id(content_hash: str) -> int:
    """The token id that stands for every position of an image in a prompt: derived from its content,
    so equal images make equal token blocks (the KV router and the prefix cache share them) and
    different images different ones. Below 2**30, as SGLang's own pad values."""
    return int(content_hash[:16], 16) % (1 << 30)
