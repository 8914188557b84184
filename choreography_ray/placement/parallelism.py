"""How many steps a worker node performs at once, read from the node itself.

Clusters of mixed machines need a limit per node: each node may carry the label
`choreography.io/max-parallel-steps` (the `parallelism_label` option names another key). A
missing, unparseable or non-positive value falls back to the cluster's `max_parallel_steps`;
an invalid one is logged once per node and value, so a misconfigured node is seen but the log
is not flooded by every placement pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

log = logging.getLogger("choreography_ray.placement")

PARALLELISM_LABEL = "choreography.io/max-parallel-steps"
"""The node label that sets a worker node's limit, unless the `parallelism_label` option names
another."""

_reported: set[tuple[str, str, str]] = set()
"""(node, key, value) of the invalid values logged already."""


def node_parallelism(
    node_id: str,
    labels: Mapping[str, str],
    key: str = PARALLELISM_LABEL,
    fallback: int | None = None,
) -> int | None:
    """The node's limit from its label `key`, else `fallback` (None: the default limit)."""
    value = labels.get(key)
    if value is None:
        return fallback
    try:
        parsed = int(value.strip())
    except ValueError:
        parsed = 0
    if parsed >= 1:
        return parsed
    if (node_id, key, value) not in _reported:
        _reported.add((node_id, key, value))
        log.warning(
            "node %s: label %s=%r is not a positive whole number; the node performs %s steps "
            "at once",
            node_id,
            key,
            value,
            fallback if fallback is not None else "the default number of",
        )
    return fallback
