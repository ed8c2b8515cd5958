"""Small helpers shared by the node tests."""

import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


def now_ms() -> int:
    return int(time.time() * 1000)


def wait_for(what: str, check: Callable[[], Optional[T]], timeout: float = 20.0, every: float = 0.1) -> T:
    """Polls ``check`` until it returns something truthy; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
