"""The encode worker's embedding cache: image content hash -> ``ImageEmbedding``, least recently used
evicted first, bounded by the bytes of embedding data it holds. Hits, misses, evictions, entries and
bytes are Prometheus metrics (``dynamo_encode_cache_*``) on the worker's ``/metrics``."""

from __future__ import annotations

from collections import OrderedDict

from prometheus_client import CollectorRegistry, Counter, Gauge

from dynamo_worker.protocol import ImageEmbedding

__all__ = ["EmbeddingCache"]


class EmbeddingCache:
    def __init__(self, max_bytes: int, registry: CollectorRegistry | None = None) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, ImageEmbedding] = OrderedDict()
        registry = registry if registry is not None else CollectorRegistry()
        self.hits = Counter(
            "dynamo_encode_cache_hits", "Images whose embeddings came from the cache", registry=registry
        )
        self.misses = Counter(
            "dynamo_encode_cache_misses", "Images the encoder had to compute", registry=registry
        )
        self.evictions = Counter(
            "dynamo_encode_cache_evictions", "Embeddings evicted (LRU)", registry=registry
        )
        self._entries = Gauge("dynamo_encode_cache_entries", "Embeddings held", registry=registry)
        self._bytes = Gauge("dynamo_encode_cache_bytes", "Bytes of embedding data held", registry=registry)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, content_hash: str) -> ImageEmbedding | None:
        item = self._items.get(content_hash)
        if item is None:
            self.misses.inc()
            return None
        self._items.move_to_end(content_hash)
        self.hits.inc()
        return item

    def put(self, item: ImageEmbedding) -> None:
        size = len(item.data)
        if size > self.max_bytes or item.content_hash in self._items:
            return  # larger than the whole cache: served, not kept
        while self._items and self.bytes + size > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.bytes -= len(old.data)
            self.evictions.inc()
        self._items[item.content_hash] = item
        self.bytes += size
        self._entries.set(len(self._items))
        self._bytes.set(self.bytes)
