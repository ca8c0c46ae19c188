"""tests/ports.py: the ports the fixtures start servers on are never ones an outgoing
connection may take (CI once lost a Redis Cluster test to a cluster-bus port taken between the
probe and redis-server's bind)."""

from __future__ import annotations

import socket

from tests.ports import free_port


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as text:
        return int(text.read().split()[0])


def test_free_ports_are_below_the_ephemeral_range_and_never_repeat() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == 200
    assert all(20000 <= port < _ephemeral_low() for port in ports)


def test_a_port_with_its_followers_is_bindable_and_handed_out_once() -> None:
    port = free_port(following=2)
    with socket.socket() as a, socket.socket() as b, socket.socket() as c:
        for sock, offset in ((a, 0), (b, 1), (c, 2)):
            sock.bind(("127.0.0.1", port + offset))
    later = {free_port() for _ in range(200)}
    assert not later & {port, port + 1, port + 2}
