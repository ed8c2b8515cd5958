"""Pull delivery against a real node: reserve, ack, nack, redelivery."""

import time

from _util import now_ms

import tocsin

N = 50
NACKED = 10


def test_reserve_ack_nack(client, namespace):
    with client.reserve(namespace, "jobs", ttr_ms=2000) as reservation:
        fire_at = now_ms() + 1000
        ids = [f"job-{i:02d}" for i in range(N)]
        results = client.create_many(
            [{"namespace": namespace, "id": i, "fire_at_ms": fire_at, "topic": "jobs", "payload": i} for i in ids]
        )
        assert all(isinstance(r, tuple) and r[1] for r in results), results
        to_nack = set(ids[::N // NACKED])
        assert len(to_nack) == NACKED

        first = {}  # id -> Delivery (attempt 1)
        second = {}  # id -> Delivery (attempt 2)
        early = []
        deadline = time.monotonic() + 45
        while len(first) < N or len(second) < NACKED:
            assert time.monotonic() < deadline, (
                f"timed out: {len(first)} first attempts, {len(second)} second attempts"
            )
            d = reservation.get(timeout=1.0)
            if d is None:
                continue
            batch = [d]
            while True:  # whatever else already arrived
                more = reservation.get(timeout=0)
                if more is None:
                    break
                batch.append(more)
            received = now_ms()
            to_ack = []
            for d in batch:
                assert isinstance(d, tocsin.Delivery)
                if received < d.fire_at_ms or d.fired_at_ms < d.fire_at_ms:
                    early.append((d.id, d.fire_at_ms, d.fired_at_ms, received))
                assert d.namespace == namespace and d.topic == "jobs"
                assert d.payload == d.id.encode()
                assert d.fire_at_ms == fire_at
                assert d.fire_id.startswith("f-") and d.cluster_id and d.epoch >= 1
                if d.attempt == 1:
                    assert d.id not in first, f"{d.id} delivered twice as attempt 1"
                    first[d.id] = d
                    if d.id in to_nack:
                        assert d.nack(delay_ms=500, reason="not now") == "OK"
                    else:
                        to_ack.append(d)
                else:
                    assert d.attempt == 2, f"{d!r}: only nacked timers come back, once"
                    assert d.id in to_nack, f"{d.id} was acked, yet delivered again"
                    assert d.id not in second
                    assert d.fire_id == first[d.id].fire_id, "a redelivery keeps its fire id"
                    second[d.id] = d
                    to_ack.append(d)
            assert client.ack(to_ack) == ["OK"] * len(to_ack)

        assert early == [], f"delivered before their fire time: {early}"
        assert set(first) == set(ids)
        assert set(second) == to_nack

        # Nothing else comes back (everything is acked).
        assert reservation.get(timeout=1.0) is None

    assert reservation.closed
    delivered = [t.id for t in client.list(namespace, state="DELIVERED", page_size=20)]
    assert sorted(delivered) == ids
