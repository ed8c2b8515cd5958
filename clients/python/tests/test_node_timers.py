"""Create, get, list, reschedule and cancel against a real node."""

import pytest
from _util import now_ms

import tocsin

# Never called: the timers here are cancelled long before they are due.
HOOK = "http://127.0.0.1:9/never"


def test_create_get_list_reschedule_cancel(client, namespace):
    fire_at = now_ms() + 600_000
    timer, created = client.create(
        namespace,
        "t-1",
        fire_at_ms=fire_at,
        payload=b'{"order": 42}',
        webhook=HOOK,
        labels={"team": "payments"},
        retry={"max_attempts": 5},
    )
    assert created is True
    assert (timer.namespace, timer.id, timer.fire_at_ms) == (namespace, "t-1", fire_at)
    assert tocsin.state_name(timer) == "SCHEDULED"
    assert timer.payload == b'{"order": 42}'
    assert dict(timer.labels) == {"team": "payments"}
    assert timer.callback.webhook.url == HOOK
    assert timer.retry.max_attempts == 5
    assert timer.generation == 1

    # An identical create is an idempotent retry.
    again, created = client.create(
        namespace,
        "t-1",
        fire_at_ms=fire_at,
        payload=b'{"order": 42}',
        webhook=HOOK,
        labels={"team": "payments"},
        retry={"max_attempts": 5},
    )
    assert created is False
    assert (again.id, again.generation, again.fire_at_ms) == ("t-1", 1, fire_at)

    # The same id with another spec is taken.
    with pytest.raises(tocsin.AlreadyExists) as exc:
        client.create(namespace, "t-1", fire_at_ms=fire_at + 1, webhook=HOOK)
    assert exc.value.code.name == "ALREADY_EXISTS"

    got = client.get(namespace, "t-1")
    assert (got.id, got.fire_at_ms, got.generation, got.payload) == ("t-1", fire_at, 1, b'{"order": 42}')

    # More timers, a pull one among them, listed over several pages.
    client.create(namespace, "t-2", delay_ms=600_000, webhook=HOOK)
    client.create(namespace, "t-3", delay_ms=600_000, topic="jobs")
    ids = [t.id for t in client.list(namespace, page_size=1)]
    assert sorted(ids) == ["t-1", "t-2", "t-3"]
    assert len(ids) == 3  # no page repeated
    assert sorted(t.id for t in client.list(namespace, state="SCHEDULED", page_size=2)) == ["t-1", "t-2", "t-3"]
    assert list(client.list(namespace, state="DELIVERED")) == []

    # Reschedule: a compare-and-set on the generation.
    moved = client.reschedule(namespace, "t-1", fire_at_ms=fire_at + 60_000, expected_generation=1)
    assert (moved.fire_at_ms, moved.generation) == (fire_at + 60_000, 2)
    with pytest.raises(tocsin.FailedPrecondition):
        client.reschedule(namespace, "t-1", fire_at_ms=fire_at, expected_generation=1)
    # Without expected_generation the client reads the current one first.
    moved = client.reschedule(namespace, "t-1", delay_ms=900_000)
    assert moved.generation == 3
    assert moved.fire_at_ms >= now_ms() + 800_000

    # Cancel: definite outcomes.
    assert client.cancel(namespace, "t-1") == "CANCELLED"
    assert client.cancel(namespace, "t-1") == "ALREADY_CANCELLED"
    assert client.cancel(namespace, "missing") == "NOT_FOUND"
    assert tocsin.state_name(client.get(namespace, "t-1")) == "CANCELLED"
    assert [t.id for t in client.list(namespace, state="CANCELLED")] == ["t-1"]
    with pytest.raises(tocsin.FailedPrecondition):
        client.reschedule(namespace, "t-1", delay_ms=1_000, expected_generation=3)

    # The finished id is kept: the same spec again is refused with the finer
    # reason, unless replace_finished.
    fresh_fire = now_ms() + 600_000
    client.cancel(namespace, "t-2")
    with pytest.raises(tocsin.FailedPrecondition) as exc:
        client.create(namespace, "t-2", delay_ms=600_000, webhook=HOOK)
    assert exc.value.reason == "TIMER_FINISHED"
    replaced, created = client.create(
        namespace, "t-2", fire_at_ms=fresh_fire, webhook=HOOK, replace_finished=True
    )
    assert created is True
    assert replaced.generation >= 2
    assert tocsin.state_name(replaced) == "SCHEDULED"


def test_create_many_answers_per_item(client, namespace):
    results = client.create_many(
        [
            {"namespace": namespace, "id": "a", "delay_ms": 600_000, "topic": "jobs"},
            {"namespace": namespace, "id": "b", "delay_ms": 600_000, "webhook": HOOK, "payload": "text"},
            {"namespace": namespace, "id": "c", "fire_at_ms": 1_000, "topic": "jobs"},
        ]
    )
    assert len(results) == 3
    (a, a_created), (b, b_created) = results[0], results[1]
    assert (a.id, a_created, b.id, b_created, b.payload) == ("a", True, "b", True, b"text")
    err = results[2]
    assert isinstance(err, tocsin.InvalidArgument)
    assert err.field == "fire_at_ms"
    assert sorted(t.id for t in client.list(namespace)) == ["a", "b"]
