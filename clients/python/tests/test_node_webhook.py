"""A webhook timer delivered to a real local HTTP server, which checks the
signature with verify_signature and fences with Fence."""

import base64
import hashlib
import hmac
import json
import os
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from _util import now_ms, wait_for

import tocsin
from tocsin.webhook import Fence, parse_delivery, verify_signature


class Receiver:
    """A webhook receiver on 127.0.0.1: verify, fence, answer."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.fence = Fence()
        self.seen = []  # (verified, verdict, status, headers, body, received_ms)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                received_ms = now_ms()
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                verified = verify_signature(receiver.secret, self.headers, body)
                verdict = None
                if not verified:
                    status, text = 401, "bad signature"
                else:
                    verdict = receiver.fence.check(parse_delivery(body))
                    status, text = Fence.http_response(verdict)
                with receiver.lock:
                    receiver.seen.append((verified, verdict, status, dict(self.headers), body, received_ms))
                data = text.encode()
                self.send_response(status)
                self.send_header("content-type", "text/plain")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def post(self, headers: dict, body: bytes):
        """POSTs as a node would; returns (status, body text)."""
        req = urllib.request.Request(self.url, data=body, method="POST", headers={**headers, "x-test-replay": "1"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def resign(secret_key: bytes, headers: dict, body: bytes) -> dict:
    """Headers for ``body`` signed with the secret, as a node (an older
    leader, say) would sign it; computed independently of tocsin.webhook."""
    msg_id, ts = headers["webhook-id"], headers["webhook-timestamp"]
    mac = hmac.new(secret_key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": ts,
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }


@pytest.fixture
def receiver_secret():
    key = os.urandom(32)
    return key, "whsec_" + base64.b64encode(key).decode()


def test_signed_webhook_is_verified_and_fenced(node, client, namespace, receiver_secret):
    key, secret = receiver_secret
    node.cli("admin", "namespace", "rotate-secret", namespace, env={"TOCSIN_NEW_SECRET": secret})
    receiver = Receiver(secret)
    try:
        # The node signs with the cluster map's secret within about a second.
        time.sleep(2.5)
        timer, created = client.create(
            namespace, "hook-1", delay_ms=300, payload=b'{"order": 42}', webhook=receiver.url, labels={"k": "v"}
        )
        assert created

        def first():
            with receiver.lock:
                return receiver.seen[0] if receiver.seen else None

        verified, verdict, status, headers, body, received_ms = wait_for("the webhook delivery", first, timeout=30)
        assert verified, f"signature did not verify: {headers}"
        assert (verdict, status) == ("accept", 200)

        lower = {k.lower(): v for k, v in headers.items()}
        delivery = json.loads(body)
        assert delivery["namespace"] == namespace and delivery["id"] == "hook-1"
        assert base64.b64decode(delivery["payload"]) == b'{"order": 42}'
        assert delivery["labels"] == {"k": "v"}
        assert delivery["attempt"] == 1
        assert delivery["fire_id"] == lower["webhook-id"]
        assert delivery["fire_id"].startswith("f-")
        assert delivery["epoch"] >= 1
        assert delivery["cluster_id"]
        assert delivery["fired_at_ms"] >= delivery["fire_at_ms"] == timer.fire_at_ms
        assert received_ms >= delivery["fire_at_ms"], "delivered before its fire time"
        for field in ("shard", "attempt_index", "late_by_ms"):
            assert field in delivery

        wait_for(
            "the timer to be DELIVERED",
            lambda: tocsin.state_name(client.get(namespace, "hook-1")) == "DELIVERED",
            timeout=10,
        )

        # The same delivery again (a retry after a lost reply): duplicate.
        replay = {k: lower[k] for k in ("content-type", "webhook-id", "webhook-timestamp", "webhook-signature") if k in lower}
        assert receiver.post(replay, body) == (200, "duplicate")

        # A copy from an older leader (epoch - 1), properly signed: stale.
        old = dict(delivery, epoch=delivery["epoch"] - 1)
        old_body = json.dumps(old).encode()
        status, text = receiver.post(resign(key, lower, old_body), old_body)
        assert status == 409 and "stale epoch" in text

        # A tampered body fails the signature check.
        tampered = json.dumps(dict(delivery, payload=base64.b64encode(b"evil").decode())).encode()
        assert not verify_signature(secret, replay, tampered)
        assert receiver.post(replay, tampered)[0] == 401
        # ...as does the right body under another secret.
        assert not verify_signature("whsec_" + base64.b64encode(os.urandom(32)).decode(), replay, body)

        # Every request the node itself sent verified.
        with receiver.lock:
            from_node = [s for s in receiver.seen if "x-test-replay" not in {k.lower() for k in s[3]}]
        assert from_node and all(s[0] for s in from_node)
    finally:
        receiver.close()
