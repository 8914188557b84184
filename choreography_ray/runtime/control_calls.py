"""Blocking calls to Ray's control store (the GCS), made off a host's event loop in threads of
their own.

While the control store restarts, such a call (a named-actor listing, a key-value read, the
node table) hangs until it is back, a minute or more. Made through the loop's default
executor, a few of them took all its threads (six on two CPUs), and a step's own
`asyncio.to_thread` then waited behind them: the steps stood still for the whole outage. Here
they have a small pool of their own, so that a restart holds up only what needs the store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ..storage.blocking import BlockingCalls

T = TypeVar("T")

CONTROL_STORE_THREADS = 4
"""Enough for the readings a host keeps going at once (its routes, the advertisements, its
membership watch, the autoscaler's marks); more wait their turn, as they would wait for the
control store anyway."""

_threads = BlockingCalls(CONTROL_STORE_THREADS, "choreography-gcs")
"""The storage providers' threads for blocking calls: daemons, started with the first call, so
a call that hangs on an absent control store never holds up the process's exit."""


async def control_store_call(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`call(*args, **kwargs)` in the control-store threads, awaited from the loop."""
    return await _threads.submit(functools.partial(call, *args, **kwargs))
