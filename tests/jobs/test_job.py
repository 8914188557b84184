"""What `Job.create_step` gives a planned step."""

from __future__ import annotations

import uuid

from choreography_ray.jobs.job import new_step_id


def test_new_step_ids_are_distinct_version_4_uuids_in_hex():
    ids = [new_step_id() for _ in range(3000)]  # several batches of the id pool
    assert len(set(ids)) == len(ids)
    for value in ids[::97]:
        parsed = uuid.UUID(hex=value)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert parsed.hex == value
