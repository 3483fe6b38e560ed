"""Ports a process must be told before it starts (dynamo-run's pods, the tests' servers) are picked free,
distinct, and below the kernel's ephemeral range, where no port-0 bind or outgoing connection of another
process can take one before its process binds it."""

from __future__ import annotations

import socket

import pytest
from dynamo_worker.runtime.nats_server import PICK_FLOOR, _ephemeral_floor, free_ports

pytestmark = pytest.mark.integration


def test_picked_ports_are_distinct_free_and_below_the_ephemeral_range():
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert all(PICK_FLOOR <= p < _ephemeral_floor() for p in ports), ports
    socks = [socket.socket() for _ in ports]
    try:
        for sock, port in zip(socks, ports, strict=True):
            sock.bind(("127.0.0.1", port))  # each is free, also all at once
    finally:
        for sock in socks:
            sock.close()
