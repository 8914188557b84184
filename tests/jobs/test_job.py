"""What `Job.create_step` gives a planned step."""

from __future__ import annotations

import time
import uuid

from choreography_ray.jobs.job import _OrderedIds, new_step_id


def test_new_step_ids_are_distinct_version_7_uuids_in_hex_in_increasing_order():
    """Increasing, so that a plan's rows go to the end of the steps table's key index."""
    before = time.time_ns() // 1_000_000
    ids = [new_step_id() for _ in range(3000)]  # several batches of the id pool
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    for value in ids[::97]:
        parsed = uuid.UUID(hex=value)
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert parsed.hex == value
        assert before <= parsed.int >> 80 <= after  # milliseconds since the epoch


def test_a_millisecond_whose_counter_runs_out_moves_to_the_next_and_stays_in_order():
    ids = _OrderedIds()
    first = ids()
    ids._seq = (1 << 30) - 2  # as if a billion ids were made within this millisecond
    ids._last = int(first[:12], 16) + 1000  # and the clock had not moved since
    made = [ids() for _ in range(4)]
    assert [first, *made] == sorted([first, *made]) and len(set(made)) == 4
    assert int(made[-1][:12], 16) == int(first[:12], 16) + 1001
