"""Pick a worker for each request: round-robin, random, or kv-aware (prefix cache + load)."""

from dynamo_worker.router.index import KvIndex
from dynamo_worker.router.policy import KvWeights, RouterMode, kv_cost
from dynamo_worker.router.router import Choice, Flight, Router

__all__ = ["Choice", "Flight", "KvIndex", "KvWeights", "Router", "RouterMode", "kv_cost"]
