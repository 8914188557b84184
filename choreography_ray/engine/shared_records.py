"""Records that hosts share through step storage (a key's places, a rate's bucket): written by
compare-and-set, so that two hosts changing one record at once cannot both win."""

from __future__ import annotations

from ..jobs.errors import VersionConflictError
from ..jobs.registry import Payload
from ..jobs.state import JobStepState
from ..storage.protocols import JobStepStorage


async def save_shared(
    steps: JobStepStorage,
    stored: JobStepState | None,
    *,
    record_id: str,
    job_id: str,
    record_type: str,
    state: Payload,
) -> bool:
    """Write `state` into the record as it was read (`stored`; None: made now). False when
    another host changed it since: the caller reads it again."""
    updated = stored or JobStepState.prepared(
        id=record_id, job_id=job_id, type=record_type, name="", stage=0, state=state
    )
    updated.state = state
    try:
        await steps.save(updated)
    except VersionConflictError:
        return False
    return True
