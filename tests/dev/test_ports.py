"""Ports for local servers: each pytest-xdist worker picks from a block of its own, below the
kernel's ephemeral range (where outgoing connections take theirs)."""

from __future__ import annotations

import socket

import pytest

from rsub_dev import ports
from rsub_dev.ports import HOST, free_ports, port_block


def workers(count: int) -> list[dict[str, str]]:
    return [
        {"PYTEST_XDIST_WORKER": f"gw{i}", "PYTEST_XDIST_WORKER_COUNT": str(count)}
        for i in range(count)
    ]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 8])
def test_the_workers_blocks_are_disjoint_and_below_the_ephemeral_range(count: int) -> None:
    blocks = [port_block(env) for env in workers(count)]
    everything = port_block({})
    taken: set[int] = set()
    for block in blocks:
        assert len(block) >= 2_000
        assert set(block) <= set(everything)
        assert taken.isdisjoint(block)
        taken |= set(block)
    assert everything.stop <= ports._ephemeral_first()


def test_a_worker_replacing_a_crashed_one_gets_a_whole_block() -> None:
    """xdist numbers a replacement worker on (`gw3` of 3 after a crash): it takes the block
    of its number modulo the count, not an empty range past the last (a CI run where one
    crashed worker's successor failed 121 tests with "no free ports in 32767-32767")."""
    blocks = [port_block(env) for env in workers(3)]
    for index in (3, 4, 7):
        env = {"PYTEST_XDIST_WORKER": f"gw{index}", "PYTEST_XDIST_WORKER_COUNT": "3"}
        assert port_block(env) == blocks[index % 3]


def test_two_workers_never_hand_out_the_same_port(monkeypatch: pytest.MonkeyPatch) -> None:
    handed: list[set[int]] = []
    for env in workers(2):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(ports, "_issued", set())  # each worker is a process of its own
        got = free_ports(500)
        assert len(set(got)) == 500
        assert set(got) <= set(port_block(env))
        handed.append(set(got))
    assert handed[0].isdisjoint(handed[1])


def test_a_port_something_listens_on_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:
        squatter.bind((HOST, 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        monkeypatch.setattr(ports, "port_block", lambda: range(taken, taken + 1))
        monkeypatch.setattr(ports, "_issued", set())
        with pytest.raises(OSError, match=f"no 1 free ports in {taken}-{taken} "):
            free_ports(1)
