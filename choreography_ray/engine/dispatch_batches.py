"""Sending a dispatch's starts in batches, each on its way before the next is taken.

Taking a start from the ledger costs the controller a few microseconds, and a fan-out's first
dispatch takes thousands: 10,000 starts took 20 ms before the first batch left, while the
worker hosts waited. Here a batch's send begins as soon as the batch is taken, so the workers
start on it while the controller takes the rest (benchmarks/RESULTS.md, "twelfth sitting").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .messages import StepStart

Answer = TypeVar("Answer")

Take = Callable[[int], tuple[list[StepStart], dict[str, str]]]
"""Up to so many waiting starts, tracked as sent, and the hosts some of them go back to."""


async def send_in_batches(
    take: Take,
    room: int,
    batch_size: int,
    send: Callable[[list[StepStart], dict[str, str]], Awaitable[Answer]],
) -> tuple[list[list[StepStart]], list[asyncio.Future[Answer]]]:
    """Take up to `room` starts, `batch_size` at a time, beginning each batch's send as it is
    taken: the batches, and their sends to await (the caller awaits them outside the job's
    turn). Cancelled meanwhile, it cancels the sends it began, as a gather of them would."""
    batches: list[list[StepStart]] = []
    sends: list[asyncio.Future[Answer]] = []
    try:
        while (taken := sum(map(len, batches))) < room:
            batch, sticky = take(min(room - taken, batch_size))
            if not batch:
                break
            batches.append(batch)
            sends.append(asyncio.ensure_future(send(batch, sticky)))
            await asyncio.sleep(0)  # the send begins: the batch is on its way
    except BaseException:
        for pending in sends:
            pending.cancel()
        raise
    return batches, sends
