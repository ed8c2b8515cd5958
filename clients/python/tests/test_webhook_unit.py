"""verify_signature and Fence, without a node. Signatures are computed here
independently (hmac/hashlib), not with the module under test."""

import base64
import hashlib
import hmac
import json
import threading

import pytest

from tocsin.webhook import Fence, parse_delivery, secret_bytes, sign, verify_signature

KEY = bytes(range(32))
WHSEC = "whsec_" + base64.b64encode(KEY).decode()
NOW = 1_800_000_000


def independent_sig(key: bytes, msg_id: str, ts: str, body: bytes) -> str:
    digest = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers_for(key: bytes, body: bytes, msg_id: str = "f-abc-3-17", ts: int = NOW) -> dict:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": independent_sig(key, msg_id, str(ts), body),
    }


def test_standard_webhooks_reference_vector():
    # The Standard Webhooks specification's test vector (also in
    # crates/tocsin-contract/src/signing.rs).
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    assert verify_signature(secret, headers, body, now=1614265330)
    assert sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == headers["webhook-signature"]
    # One timestamp off: the signature no longer matches.
    assert not verify_signature(secret, {**headers, "webhook-timestamp": "1614265331"}, body, now=1614265330)


def test_whsec_secret_is_base64_decoded():
    body = b'{"id":"order-42"}'
    assert secret_bytes(WHSEC) == KEY
    assert verify_signature(WHSEC, headers_for(KEY, body), body, now=NOW)
    # The whsec_ text itself is not the key.
    assert not verify_signature(WHSEC, headers_for(WHSEC.encode(), body), body, now=NOW)


def test_plain_secret_is_its_utf8_bytes():
    secret = "a plain secret of enough bytes, ünïcode"
    body = b"{}"
    assert verify_signature(secret, headers_for(secret.encode("utf-8"), body), body, now=NOW)


def test_malformed_whsec_secret_is_an_error():
    with pytest.raises(ValueError):
        verify_signature("whsec_not base64!", headers_for(KEY, b"{}"), b"{}", now=NOW)


def test_tampered_body_id_or_timestamp_fail():
    body = b'{"id":"order-42","epoch":7}'
    h = headers_for(KEY, body)
    assert verify_signature(WHSEC, h, body, now=NOW)
    assert not verify_signature(WHSEC, h, body.replace(b"42", b"43"), now=NOW)
    assert not verify_signature(WHSEC, {**h, "webhook-id": "f-other"}, body, now=NOW)
    assert not verify_signature(WHSEC, {**h, "webhook-timestamp": str(NOW + 1)}, body, now=NOW)
    assert not verify_signature(b"another key, 32 bytes long.....", h, body, now=NOW)


def test_timestamp_tolerance():
    body = b"{}"
    old = headers_for(KEY, body, ts=NOW - 301)
    assert not verify_signature(WHSEC, old, body, now=NOW)
    assert verify_signature(WHSEC, old, body, now=NOW, tolerance_s=302)
    future = headers_for(KEY, body, ts=NOW + 301)
    assert not verify_signature(WHSEC, future, body, now=NOW)
    assert verify_signature(WHSEC, headers_for(KEY, body, ts=NOW - 300), body, now=NOW)
    bad = {**headers_for(KEY, body), "webhook-timestamp": "yesterday"}
    assert not verify_signature(WHSEC, bad, body, now=NOW)


def test_several_signatures_any_may_match_and_headers_are_case_insensitive():
    body = b"{}"
    good = independent_sig(KEY, "id-1", str(NOW), body)
    headers = {
        "Webhook-Id": "id-1",
        "WEBHOOK-TIMESTAMP": str(NOW),
        "Webhook-Signature": f"v1,bogus v2,{good[3:]} v1,AAAA {good}",
    }
    assert verify_signature(WHSEC, headers, body, now=NOW)
    headers["Webhook-Signature"] = f"v1,bogus v2,{good[3:]}"
    assert not verify_signature(WHSEC, headers, body, now=NOW)


def test_missing_headers_fail():
    body = b"{}"
    h = headers_for(KEY, body)
    for name in h:
        partial = {k: v for k, v in h.items() if k != name}
        assert not verify_signature(WHSEC, partial, body, now=NOW)


def test_http_server_headers_object():
    import email.message

    body = b'{"x":1}'
    msg = email.message.Message()
    for k, v in headers_for(KEY, body).items():
        msg[k.title()] = v
    assert verify_signature(WHSEC, msg, body, now=NOW)


def delivery(epoch: int, fire_id: str, shard: int = 3, cluster_id: str = "3f9c2a7e51d04b86") -> dict:
    return {"cluster_id": cluster_id, "shard": shard, "epoch": epoch, "fire_id": fire_id}


def test_fence_accept_duplicate_stale():
    fence = Fence()
    assert fence.check(delivery(5, "f-1")) == "accept"
    assert fence.check(delivery(5, "f-1")) == "duplicate"
    assert fence.check(delivery(4, "f-2")) == "stale"
    # A stale delivery records nothing: the same fire id at a current epoch
    # is still new.
    assert fence.check(delivery(5, "f-2")) == "accept"
    # A higher epoch raises the bar; a duplicate at a higher epoch raises it too.
    assert fence.check(delivery(9, "f-1")) == "duplicate"
    assert fence.max_epoch("3f9c2a7e51d04b86", 3) == 9
    assert fence.check(delivery(8, "f-3")) == "stale"
    assert Fence.http_response("stale") == (409, "stale epoch")
    assert Fence.http_response("duplicate")[0] == 200


def test_fence_keys_epochs_by_cluster_and_shard():
    fence = Fence()
    assert fence.check(delivery(100, "f-a", shard=1)) == "accept"
    # Another shard, another cluster: their own epochs.
    assert fence.check(delivery(2, "f-b", shard=2)) == "accept"
    assert fence.check(delivery(1, "f-c", shard=1, cluster_id="new-cluster")) == "accept"
    assert fence.check(delivery(99, "f-d", shard=1)) == "stale"


def test_fence_accepts_json_bodies_and_objects():
    fence = Fence()
    body = json.dumps({**delivery(3, "f-j"), "payload": base64.b64encode(b"hi").decode()}).encode()
    assert fence.check(body) == "accept"
    assert fence.check(parse_delivery(body)) == "duplicate"
    assert parse_delivery(body)["payload"] == b"hi"

    class Obj:
        cluster_id, shard, epoch, fire_id = "3f9c2a7e51d04b86", 3, 3, "f-j"

    assert fence.check(Obj()) == "duplicate"


def test_fence_bounds_remembered_fire_ids():
    fence = Fence(max_fire_ids=3)
    for i in range(3):
        assert fence.check(delivery(1, f"f-{i}")) == "accept"
    assert fence.check(delivery(1, "f-0")) == "duplicate"  # f-0 now most recent
    assert fence.check(delivery(1, "f-3")) == "accept"  # evicts f-1
    assert len(fence) == 3
    assert fence.check(delivery(1, "f-1")) == "accept"
    assert fence.check(delivery(1, "f-0")) == "duplicate"


def test_fence_process_rolls_back_a_failed_effect():
    fence = Fence()
    done = []

    def fail():
        raise RuntimeError("database down")

    with pytest.raises(RuntimeError):
        fence.process(delivery(1, "f-p"), fail)
    assert fence.process(delivery(1, "f-p"), lambda: done.append(1) or "ok") == ("accept", "ok")
    assert fence.process(delivery(1, "f-p"), lambda: done.append(2)) == ("duplicate", None)
    assert done == [1]


def test_fence_is_thread_safe():
    fence = Fence()
    verdicts = []
    lock = threading.Lock()

    def worker():
        for i in range(500):
            v = fence.check(delivery(1, f"f-{i}"))
            with lock:
                verdicts.append(v)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert verdicts.count("accept") == 500
    assert verdicts.count("duplicate") == 7 * 500
