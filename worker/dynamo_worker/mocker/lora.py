"""The mocker's LoRA adapters, kept as SGLang keeps them. Pure (no I/O, no clock).

- Held adapters (loaded, in CPU memory): at most ``max_loaded_loras``; a load past it evicts the least
  recently *used* unpinned one (SGLang's registry order: a request's use counts).
- Batch slots: a batch runs at most ``max_loras_per_batch`` distinct adapters, the base model counting
  as one (``can_join``); a waiting request whose adapter does not fit waits while later ones may go.
  Pinned adapters keep a slot each, so at most ``max_loras_per_batch - 1`` may be pinned.
- The GPU pool: ``max_loras_per_batch`` buffers. An adapter a batch needs that is not in a buffer is
  copied in (``bring_in`` counts these swaps, which cost time), evicting an adapter the batch does not
  need, least recently used or first loaded (``--lora-eviction-policy``); pinned ones stay.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Literal

from dynamo_worker.runtime.lora_checks import LoraError

__all__ = ["MockLoras"]

Adapter = str | None  # None: the base model


class MockLoras:
    def __init__(
        self,
        max_loras_per_batch: int,
        max_loaded_loras: int | None = None,
        eviction_policy: Literal["lru", "fifo"] = "lru",
    ) -> None:
        self.max_loras_per_batch = max_loras_per_batch
        self.max_loaded_loras = max_loaded_loras
        self.eviction_policy = eviction_policy
        self.held: OrderedDict[str, bool] = OrderedDict()  # name -> pinned, least recently used first
        self.unloading: set[str] = set()  # out of service: running requests finish, new ones refused
        self._pool: OrderedDict[Adapter, None] = OrderedDict()  # GPU buffers, eviction order first
        self.swaps = 0  # adapters copied into the GPU pool so far

    # --- held adapters ---------------------------------------------------------------------------

    def serves(self, name: str) -> bool:
        return name in self.held and name not in self.unloading

    def load(self, name: str, pinned: bool) -> list[str]:
        """Hold ``name``; past ``max_loaded_loras`` evict the least recently used unpinned adapters.
        The names held afterwards."""
        self.held[name] = pinned
        self.held.move_to_end(name)
        while self.max_loaded_loras is not None and len(self.held) > self.max_loaded_loras:
            victim = next((n for n, p in self.held.items() if not p and n != name), None)
            if victim is None:
                del self.held[name]
                raise LoraError(
                    "NoFreeSlot", f"every adapter held is pinned; none can make room for {name!r}"
                )
            self._forget(victim)
        return list(self.held)

    def unload(self, name: str) -> list[str]:
        self._forget(name)
        return list(self.held)

    def _forget(self, name: str) -> None:
        self.held.pop(name, None)
        self.unloading.discard(name)
        self._pool.pop(name, None)

    def use(self, name: Adapter) -> None:
        """A request for ``name`` arrived (SGLang's registry moves it to the most recently used end)."""
        if name is not None and name in self.held:
            self.held.move_to_end(name)

    # --- batch slots -----------------------------------------------------------------------------

    def _pinned(self, names: Iterable[Adapter]) -> int:
        return sum(1 for n in names if n is not None and self.held.get(n, False))

    def can_join(self, running: set[Adapter], name: Adapter) -> bool:
        """Whether a request for ``name`` may join a batch running ``running`` (SGLang's check: the
        distinct adapters fit the slots, pinned adapters keeping theirs)."""
        if name in running:
            return True
        wanted = running | {name}
        if len(wanted) > self.max_loras_per_batch:
            return False
        pinned_total = self._pinned(self.held)
        if pinned_total == 0:
            return True
        return len(wanted) - self._pinned(wanted) <= self.max_loras_per_batch - pinned_total

    def bring_in(self, batch: set[Adapter]) -> int:
        """Make the GPU pool hold every adapter of ``batch``; how many had to be copied in."""
        copied = 0
        for name in batch:
            if name in self._pool:
                if self.eviction_policy == "lru":
                    self._pool.move_to_end(name)
                continue
            if len(self._pool) >= self.max_loras_per_batch:
                victim = next(
                    (n for n in self._pool if n not in batch and not (n is not None and self.held.get(n))),
                    None,
                )
                if victim is not None:
                    del self._pool[victim]
            self._pool[name] = None
            if name is not None:
                copied += 1
        self.swaps += copied
        return copied

    def resident(self) -> list[str]:
        """Adapters in the GPU pool now."""
        return [n for n in self._pool if n is not None]
