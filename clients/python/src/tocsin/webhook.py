"""Helpers for a webhook receiver: signature checks and fencing.

A Tocsin node POSTs each delivery as a JSON body with `Standard Webhooks
<https://www.standardwebhooks.com/>`_ headers: ``webhook-id`` (the fire id),
``webhook-timestamp`` (unix seconds) and, when the namespace has a signing
secret, ``webhook-signature`` (``v1,<base64 HMAC-SHA256>`` entries,
space-separated while a rotated-out secret still signs). Check it with
:func:`verify_signature`, then run the delivery through a :class:`Fence`
(docs/delivery.md, "How a receiver fences")::

    fence = Fence()

    def handle(headers, body: bytes) -> tuple[int, str]:
        if not verify_signature(SECRET, headers, body):
            return 401, "bad signature"
        delivery = parse_delivery(body)
        verdict = fence.check(delivery)
        if verdict == "stale":
            return 409, "stale epoch"          # the node stands down
        if verdict == "accept":
            do_the_work(delivery)              # see Fence.process for
        return 200, verdict                    # effect-and-record in one step
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, TypeVar, Union

__all__ = [
    "verify_signature",
    "sign",
    "secret_bytes",
    "parse_delivery",
    "Fence",
    "ACCEPT",
    "DUPLICATE",
    "STALE",
]

#: :meth:`Fence.check` verdicts.
ACCEPT = "accept"
DUPLICATE = "duplicate"
STALE = "stale"

T = TypeVar("T")


def secret_bytes(secret: Union[str, bytes]) -> bytes:
    """The HMAC key of a signing secret: ``whsec_<base64>`` is decoded (the
    Standard Webhooks convention); any other secret is its UTF-8 bytes (bytes
    are used as given).

    Raises:
        ValueError: a ``whsec_`` secret whose rest is not standard base64 (a
            configuration error, never silently used as text).
    """
    raw = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if raw.startswith(b"whsec_"):
        try:
            return base64.b64decode(raw[len(b"whsec_") :], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a secret starting with whsec_ must continue in standard base64") from None
    return raw


def _mac(key: bytes, msg_id: str, timestamp: str, body: bytes) -> bytes:
    signed = msg_id.encode("utf-8") + b"." + timestamp.encode("utf-8") + b"." + body
    return hmac.new(key, signed, hashlib.sha256).digest()


def sign(secret: Union[str, bytes], msg_id: str, timestamp: Union[int, str], body: Union[bytes, str]) -> str:
    """The ``webhook-signature`` value a node sends for ``body``:
    ``v1,<base64 HMAC-SHA256 of "{msg_id}.{timestamp}.{body}">``. Handy for
    testing a receiver."""
    if isinstance(body, str):
        body = body.encode("utf-8")
    mac = _mac(secret_bytes(secret), msg_id, str(timestamp), body)
    return "v1," + base64.b64encode(mac).decode("ascii")


def _header(headers: Any, name: str) -> Optional[str]:
    """A header by case-insensitive name from a dict, an
    ``email.message.Message`` (``http.server``), or any mapping-like object."""
    getter = getattr(headers, "get", None)
    if getter is not None:
        value = getter(name)
        if value is not None:
            return value if isinstance(value, str) else _text(value)
    items = headers.items() if hasattr(headers, "items") else headers
    for key, value in items:
        key_text = _text(key)
        if key_text.lower() == name:
            return value if isinstance(value, str) else _text(value)
    return None


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    return str(value)


def verify_signature(
    secret: Union[str, bytes],
    headers: Union[Mapping[str, str], Any],
    body: Union[bytes, str],
    *,
    tolerance_s: float = 300,
    now: Optional[float] = None,
) -> bool:
    """Checks a delivery's Standard Webhooks signature.

    Args:
        secret: the namespace's signing secret: ``whsec_<base64>`` (decoded)
            or any other text (its UTF-8 bytes are the key).
        headers: the request's headers (a dict, with any capitalisation, or
            ``http.server``'s ``self.headers``).
        body: the raw request body, exactly as received.
        tolerance_s: how far ``webhook-timestamp`` may be from ``now``.
        now: the current unix time in seconds (default: ``time.time()``).

    Returns:
        True when the timestamp is within the tolerance and one of the
        header's ``v1,`` signatures is the HMAC-SHA256 of
        ``"{webhook-id}.{webhook-timestamp}.{body}"`` under the secret
        (compared in constant time); False otherwise, including when a
        header is missing.

    Raises:
        ValueError: a malformed ``whsec_`` secret.
    """
    key = secret_bytes(secret)
    if isinstance(body, str):
        body = body.encode("utf-8")
    msg_id = _header(headers, "webhook-id")
    timestamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    if not msg_id or not timestamp or not signatures:
        return False
    timestamp = timestamp.strip()
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    current = time.time() if now is None else now
    if abs(current - ts) > tolerance_s:
        return False
    expected = _mac(key, msg_id, timestamp, bytes(body))
    ok = False
    for entry in signatures.split():
        version, _, sig = entry.partition(",")
        if version != "v1" or not sig:
            continue
        try:
            given = base64.b64decode(sig, validate=True)
        except (binascii.Error, ValueError):
            continue
        # Compare every entry (no early exit), each in constant time.
        ok = hmac.compare_digest(given, expected) or ok
    return ok


def parse_delivery(body: Union[bytes, str]) -> Dict[str, Any]:
    """The JSON delivery body as a dict, its ``payload`` base64-decoded to
    bytes. Fields: namespace, id, payload, fire_at_ms, fired_at_ms, attempt,
    shard, epoch, fire_id, cluster_id, attempt_index, late_by_ms, labels,
    occurrence (recurring timers only)."""
    delivery = json.loads(body)
    if not isinstance(delivery, dict):
        raise ValueError("a delivery body is a JSON object")
    payload = delivery.get("payload")
    if isinstance(payload, str):
        delivery["payload"] = base64.b64decode(payload)
    elif payload is None:
        delivery["payload"] = b""
    return delivery


def _fencing_facts(delivery: Any) -> Tuple[str, int, int, str]:
    """(cluster_id, shard, epoch, fire_id) of a dict, a JSON body, or an
    object with those attributes (a ``tocsin.v1.Delivery`` or
    :class:`tocsin.Delivery`)."""
    if isinstance(delivery, (bytes, bytearray, str)):
        delivery = json.loads(delivery)
    if isinstance(delivery, Mapping):
        get = delivery.get
    else:

        def get(name: str, default: Any = None) -> Any:
            return getattr(delivery, name, default)

    fire_id = get("fire_id")
    if not fire_id:
        raise ValueError("a delivery without a fire_id cannot be fenced")
    return (str(get("cluster_id", "") or ""), int(get("shard", 0) or 0), int(get("epoch", 0) or 0), str(fire_id))


class Fence:
    """The receiver's fencing rule of docs/delivery.md, in memory.

    For each delivery, in one critical section:

    1. keep ``max_epoch[(cluster_id, shard)]``; a delivery whose ``epoch``
       is lower is **stale**: answer HTTP 409 with a body containing
       ``stale epoch`` (the sending node then stands down) and do nothing;
    2. otherwise raise ``max_epoch[(cluster_id, shard)]`` to its epoch;
    3. a ``fire_id`` already seen is a **duplicate**: answer 200, do nothing;
    4. otherwise record the ``fire_id`` and **accept** it (do the work).

    Thread-safe. Remembers at most ``max_fire_ids`` fire ids (least recently
    seen forgotten first): keep it above the number of deliveries a timer's
    retry horizon can span. State lives in this process only: a receiver
    that must fence across restarts or replicas keeps the same two tables in
    its database, updated in the transaction that does the work.
    """

    def __init__(self, max_fire_ids: int = 1_000_000) -> None:
        if max_fire_ids < 1:
            raise ValueError("max_fire_ids must be at least 1")
        self.max_fire_ids = max_fire_ids
        self._lock = threading.RLock()
        self._max_epoch: Dict[Tuple[str, int], int] = {}
        self._seen: "OrderedDict[str, None]" = OrderedDict()

    def _check_locked(self, cluster_id: str, shard: int, epoch: int, fire_id: str) -> str:
        key = (cluster_id, shard)
        if epoch < self._max_epoch.get(key, 0):
            return STALE
        self._max_epoch[key] = epoch
        if fire_id in self._seen:
            self._seen.move_to_end(fire_id)
            return DUPLICATE
        self._seen[fire_id] = None
        if len(self._seen) > self.max_fire_ids:
            self._seen.popitem(last=False)
        return ACCEPT

    def check(self, delivery: Any) -> str:
        """Fences one delivery: ``"accept"`` (new: do the work; its fire id
        is now recorded), ``"duplicate"`` (answer 200 and do nothing) or
        ``"stale"`` (answer 409 ``stale epoch`` and do nothing).

        ``delivery`` is the parsed JSON body (a dict), the raw body, or an
        object with ``cluster_id``, ``shard``, ``epoch`` and ``fire_id``
        attributes (a pull :class:`tocsin.Delivery`).
        """
        facts = _fencing_facts(delivery)
        with self._lock:
            return self._check_locked(*facts)

    def process(self, delivery: Any, effect: Callable[[], T]) -> Tuple[str, Optional[T]]:
        """Fences ``delivery`` and, if accepted, runs ``effect()`` in the same
        critical section; if ``effect`` raises, the fire id is forgotten
        again (so a redelivery is accepted) and the exception propagates.
        Returns ``(verdict, effect's result or None)``. Effects run one at a
        time: keep them short, or fence in your database instead."""
        facts = _fencing_facts(delivery)
        with self._lock:
            verdict = self._check_locked(*facts)
            if verdict != ACCEPT:
                return verdict, None
            try:
                return verdict, effect()
            except BaseException:
                self._seen.pop(facts[3], None)
                raise

    def forget(self, fire_id: str) -> None:
        """Forgets a recorded fire id (after the work for an accepted
        delivery failed), so that its redelivery is accepted."""
        with self._lock:
            self._seen.pop(fire_id, None)

    def max_epoch(self, cluster_id: str, shard: int) -> int:
        """The largest epoch seen for ``(cluster_id, shard)`` (0 if none)."""
        with self._lock:
            return self._max_epoch.get((cluster_id, shard), 0)

    def __len__(self) -> int:
        """How many fire ids are remembered."""
        with self._lock:
            return len(self._seen)

    @staticmethod
    def http_response(verdict: str) -> Tuple[int, str]:
        """The HTTP status and body a webhook receiver answers for a
        verdict: 200 for accept and duplicate, 409 ``stale epoch`` for
        stale."""
        if verdict == STALE:
            return 409, "stale epoch"
        return 200, verdict
