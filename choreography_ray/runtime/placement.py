"""Starting the host actors where placement puts them, and stopping them.

Which node takes which role, and how many steps a worker node performs at once, is decided by
`placement.roles` from the nodes' facts (labels and resources); this module reads those facts
from Ray and creates the actors.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import ray

from ..jobs.errors import ConfigurationError
from ..jobs.options import JobsOptions
from ..placement.capability import failing_everywhere, import_failures
from ..placement.roles import NodeRoles, refused_role
from .adverts import read_adverts
from .config import mark_taking_down, read_config, require_config, write_config
from .constants import ACTOR_PREFIX
from .controller_host import ControllerHost
from .directory import actor_names
from .node_hosts import create_node_hosts, node_facts, node_roles
from .worker_host import WorkerHost

log = logging.getLogger("choreography_ray.runtime")


def roles_of_node(namespace: str, node_id: str) -> NodeRoles | None:
    """The roles of one live node under the cluster's options (None: it takes none), with its
    own step limit: what the hosts of a node that joins are started with."""
    config = require_config(namespace)
    roles = node_roles(config.jobs_options(), config.max_parallel_steps, config.workers_per_node)
    found = [node for node in roles if node.node_id == node_id]
    return found[0] if found else None


def check_role_labels(options: JobsOptions) -> None:
    """A node whose role label cannot be read fails `connect` in one line naming it."""
    problems = [
        p for node in node_facts() if node.alive and (p := refused_role(node, options.role_label))
    ]
    if problems:
        raise ConfigurationError("; ".join(problems))


def start_hosts(
    namespace: str, max_parallel_steps: int | None = None, workers_per_node: int | None = None
) -> dict[str, Any]:
    """Create the host actors that are missing (idempotent); returns every host by name.

    A worker node runs several worker host processes, so that step bookkeeping can use more
    than one core (each is bound to one by the GIL): `workers_per_node` of them when given,
    else one per CPU of that node within bounds (`engine.limits.worker_hosts`). The node's
    limit (its label, else `max_parallel_steps`) is shared among them. Either left out is
    the cluster configuration's, which a node that joins later is placed by too.
    """
    config = require_config(namespace)
    options = config.jobs_options()
    max_parallel_steps = max_parallel_steps or config.max_parallel_steps
    workers_per_node = workers_per_node or config.workers_per_node
    check_role_labels(options)
    mark_taking_down(namespace, False)  # hosts run again: a host killed later is restarted
    hosts: dict[str, Any] = {}
    for roles in node_roles(options, max_parallel_steps, workers_per_node):
        hosts.update(
            create_node_hosts(
                namespace, roles, controller_class=ControllerHost, worker_class=WorkerHost
            )
        )
    # Hosts that already ran keep their state; refresh makes them read new modules and keys.
    ray.get([handle.ready.remote() for handle in hosts.values()])
    answers = ray.get([h.refresh.remote() for h in hosts.values()])
    nowhere = failing_everywhere(answers)
    if nowhere:
        # No host runs the module's types: it is a mistake, not a node that differs.
        _forget_modules(namespace, sorted(nowhere))
        raise ConfigurationError(
            "the hosts could not import job module(s): "
            + "; ".join(sorted(nowhere.values()))
            + " (install them on every node, or put them on the workers' PYTHONPATH)"
        )
    failures = import_failures(read_adverts(namespace, list(hosts)).values())
    for failure in failures:
        # The node is left out of those types' eligible hosts; the others run them.
        log.warning("%s", failure)
    return hosts


def _forget_modules(namespace: str, modules: list[str]) -> None:
    """A module no host can import is taken out of the configuration again."""
    config = require_config(namespace)
    bad = set(modules)
    kept = {
        "modules": [m for m in config.modules if m not in bad],
        "packages": {m: p for m, p in config.packages.items() if m not in bad},
    }
    write_config(config.model_copy(update=kept), namespace)


STOP_ROUNDS = 3
"""How many times `stop_hosts` lists the hosts again for one that started meanwhile."""
SHUTDOWN_MARGIN = 10.0
"""Seconds a host's shutdown may take beyond its deactivation (closing storage, its advert)."""


def stop_hosts(namespace: str) -> list[str]:
    """Kill every host actor of the namespace (their jobs stay in storage).

    The namespace is marked as taken down first, so that no controller host's membership watch
    starts a host again as the others are stopped one after the other (`up` clears the mark).
    A start the watch began just before the mark may still land: the hosts are listed again
    after the kills, and stopped too."""
    config = read_config(namespace)
    mark_taking_down(namespace)
    options = config.jobs_options() if config is not None else JobsOptions()
    # A worker host waits up to `deactivation_timeout` for its steps' work as it shuts down.
    wait = options.deactivation_timeout.total_seconds() + SHUTDOWN_MARGIN
    killed: list[str] = []
    for _ in range(STOP_ROUNDS):
        stopped = [
            name for name in actor_names(namespace, (ACTOR_PREFIX,)) if _stop(namespace, name, wait)
        ]
        killed += [name for name in stopped if name not in killed]
        if not stopped:
            break
    return killed


def _stop(namespace: str, name: str, wait: float) -> bool:
    """Shut host actor `name` down (waiting `wait` seconds at most) and kill it; False when
    it is gone already."""
    try:
        handle = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    with contextlib.suppress(Exception):
        ray.get(handle.shutdown.remote(), timeout=wait)
    ray.kill(handle)
    return True
