"""The fan-out copiers' liveness watch (imgprep.stage.peers), on an in-process store: a death is
seen and published by one watcher and read by every node within two heartbeats, finished nodes are
skipped round the ring, and a look costs the store a few calls whatever the node count."""

from __future__ import annotations

import time
from typing import Any

import pytest

from imgprep.stage.peers import BEATS, HEARTBEAT, Watch, announce, await_all

torch_dist = pytest.importorskip("torch.distributed")

BEAT = 0.5  # the watches' heartbeat here: a look every BEAT / BEATS seconds


class CountingStore:
    """A store that counts the calls made through it."""

    def __init__(self, store: Any) -> None:
        self.store, self.calls = store, 0

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.store, name)

        def counted(*args: Any) -> Any:
            self.calls += 1
            return fn(*args)
        return counted


def watches(store: Any, n: int) -> list[Watch]:
    return [Watch(store, k, n, BEAT, "test") for k in range(n)]


def beat(store: Any, nodes: range | list[int]) -> None:
    for k in nodes:
        store.add(f"hb/{k}", 1)


def look(ws: list[Watch], store: Any, alive: list[int]) -> list[str | None]:
    """Every node's verdict after one look period in which ``alive`` beat."""
    beat(store, alive)
    time.sleep(BEAT / BEATS + 0.05)
    return [w.verdict() for w in ws]


def test_a_death_is_published_by_its_watcher_and_read_by_every_node() -> None:
    store = torch_dist.HashStore()
    ws = watches(store, 6)
    assert look(ws, store, list(range(6))) == [None] * 6
    alive = [0, 1, 2, 4, 5]  # node 3 stops beating
    verdicts: list[str | None] = [None] * 6
    deadline = time.monotonic() + 10
    while not all(verdicts[k] for k in alive) and time.monotonic() < deadline:
        verdicts = look(ws, store, alive)
    for k in alive:
        assert verdicts[k] is not None and verdicts[k].startswith("node 3 died (no heartbeat"), \
            (k, verdicts[k])
        assert "rerun" in verdicts[k]
    assert int(store.add("failseq", 0)) == 1  # node 2, its watcher, published it once


def test_every_node_reads_a_death_within_two_heartbeats_and_counts_it_left() -> None:
    """Watches that beat on their own threads; node 2 stops (its process died): the others'
    verdicts name it within two heartbeats of its last beat, and its watcher counts it as
    left, once, so that the store's host does not wait for it."""
    store = torch_dist.HashStore()
    ws = watches(store, 4)
    for w in ws:
        w.start()
    try:
        time.sleep(3 * BEAT)
        assert [w.verdict() for w in ws] == [None] * 4  # beating nodes look alive
        ws[2].stop.set()
        t0 = time.monotonic()
        seen: dict[int, float] = {}
        while len(seen) < 3 and time.monotonic() < t0 + 10 * BEAT:
            for k in (0, 1, 3):
                if k not in seen and ws[k].verdict() is not None:
                    seen[k] = time.monotonic() - t0
            time.sleep(0.01)
        assert sorted(seen) == [0, 1, 3] and max(seen.values()) <= 2 * BEAT, seen
        for k in (0, 1, 3):
            assert (ws[k].verdict() or "").startswith("node 2 died (no heartbeat"), ws[k].found
        assert int(store.add("left", 0)) == 1  # node 1, its watcher, counted it once
        assert HEARTBEAT == 5.0 and ws[0].beat == BEAT / BEATS
    finally:
        for w in ws:
            w.stop.set()


def test_the_first_published_failure_wins_and_names_the_node() -> None:
    store = torch_dist.HashStore()
    ws = watches(store, 3)
    ws[1].fail("node 1: shard x is corrupt")
    ws[2].fail("node 2: lost node 1")  # a consequence, published later
    time.sleep(BEAT / BEATS + 0.05)
    assert ws[0].verdict() == "node 1 failed: node 1: shard x is corrupt"
    assert ws[2].verdict() == ws[0].verdict()
    assert int(store.add("failseq", 0)) == 2


def test_a_finished_node_is_skipped_and_the_next_one_watched() -> None:
    store = torch_dist.HashStore()
    ws = watches(store, 4)
    look(ws, store, [0, 1, 2, 3])
    announce(store, "done", 1)  # node 1, which node 0 watches, finished: it beats no more
    deadline = time.monotonic() + 10
    while ws[0].watched != 2 and time.monotonic() < deadline:
        assert look(ws, store, [0, 2, 3]) == [None] * 4  # a finished node is not dead
    assert ws[0].finished == {1}
    verdicts: list[str | None] = [None] * 4
    while verdicts[0] is None and time.monotonic() < deadline:
        verdicts = look(ws, store, [0, 3])  # node 2 dies: node 0 is its watcher now
    assert verdicts[0] is not None and verdicts[0].startswith("node 2 died"), verdicts
    assert verdicts[3] == verdicts[0]
    assert store.get("first").decode().startswith("2\tdied")


@pytest.mark.parametrize("n", [4, 400])
def test_a_look_costs_a_few_store_calls_whatever_the_node_count(n: int) -> None:
    store = CountingStore(torch_dist.HashStore())
    w = Watch(store, n // 2, n, 5.0, "test")
    beat(store.store, range(n))
    looks = 3
    for _ in range(looks):
        time.sleep(w.beat + 0.02)
        for _ in range(5):  # a caller polls faster than the heartbeat: cached between looks
            assert w.verdict() is None
    assert store.calls <= 2 * looks
    Watch(store.store, 1, n, 5.0, "test").fail("node 1: disk full")
    time.sleep(w.beat + 0.02)
    calls = store.calls
    assert w.verdict() == "node 1 failed: node 1: disk full"
    assert store.calls - calls <= 2  # the first failure is one key, not one per node


def test_waiting_for_all_reads_one_counter() -> None:
    store = CountingStore(torch_dist.HashStore())
    n = 300
    w = Watch(store, 0, n, 5.0, "test")
    for k in range(n):
        announce(store.store, "have", k, f"view {k}")
    await_all(w, "have", time.monotonic() + 5, "join")
    assert store.calls <= 3
    assert store.store.get("have/7") == b"view 7"
