"""A host's own fence: the host process exits once it is no longer part of the cluster.

Ray declares a node dead when its raylet stops answering (a frozen or partitioned node), and
starts its work elsewhere; the node's processes may still run. Storage fences what they write
(every step write is a compare-and-set, so a newer run always wins), and this watch ends them:
a host exits when

- its raylet is gone (the process that started it died: after a frozen raylet wakes up and
  learns it was declared dead, it exits, and its workers are left to init);
- Ray's node table says its node is dead;
- another actor now bears the host's name (the host was replaced: the membership watch
  started a new one after taking this one for dead).

Each check needs positive evidence: a control store that does not answer (a GCS restart)
proves nothing, and the host goes on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("choreography_ray.runtime")

CHECK_SECONDS = 1.0
"""How often the parent process is checked (no Ray call)."""
ASK_SECONDS = 5.0
"""How often Ray's node table and the host's name are read (in a thread of their own: a call
that hangs while the control store restarts never holds up the parent check)."""


class Fence:
    """Watches, in a thread, whether this host is still part of the cluster; `exit` when not."""

    def __init__(
        self,
        name: str,
        node_alive: Callable[[], bool | None],
        bearer: Callable[[], str | None],
        me: str,
        *,
        exit: Callable[[str], None],
        parent: Callable[[], int] = os.getppid,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`node_alive` answers whether Ray's node table has this host's node alive (None:
        no answer); `bearer` the actor id that bears the host's name (None: no answer or no
        actor); `me` this host's actor id."""
        self.name = name
        self._node_alive = node_alive
        self._bearer = bearer
        self._me = me
        self._exit = exit
        self._parent = parent
        self._sleep = sleep
        self._stopped = threading.Event()

    def start(self) -> None:
        parent = self._parent()
        for target, every in (
            (lambda: self.orphaned(parent), CHECK_SECONDS),
            (self.ask, ASK_SECONDS),
        ):
            threading.Thread(
                target=self._loop, args=(target, every), name="choreography-fence", daemon=True
            ).start()

    def stop(self) -> None:
        self._stopped.set()

    def _loop(self, check: Callable[[], str | None], every: float) -> None:
        while not self._stopped.is_set():
            self._sleep(every)
            why = check()
            if why is not None and not self._stopped.is_set():
                self._stopped.set()
                log.error("host %s exits: %s", self.name, why)
                self._exit(why)
                return

    def orphaned(self, parent: int) -> str | None:
        """Why this host must exit, from its own process alone: its raylet exited."""
        if self._parent() != parent:
            return "its raylet is gone (the process that started it exited)"
        return None

    def ask(self) -> str | None:
        """Why this host must exit, by Ray's word: its node dead, or its name taken."""
        try:
            if self._node_alive() is False:
                return "Ray declared its node dead"
            bearer = self._bearer()
        except Exception as error:  # the control store did not answer: no evidence
            log.debug("host %s: fence check without an answer: %s", self.name, error)
            return None
        if bearer is not None and bearer != self._me:
            return f"another actor ({bearer}) bears its name: it was replaced"
        return None


def ray_fence(name: str, node_id: str, namespace: str) -> Fence:
    """The fence of a host actor, reading Ray (called inside the actor)."""
    import ray

    def node_alive() -> bool | None:
        for node in ray.nodes():
            if node.get("NodeID") == node_id:
                return bool(node.get("Alive"))
        return None

    def bearer() -> str | None:
        try:
            handle = ray.get_actor(name, namespace=namespace)
        except ValueError:  # no live actor has the name (ours is dead in Ray's eyes too)
            return None
        return str(handle._actor_id.hex())

    me = ray.get_runtime_context().get_actor_id() or ""
    return Fence(name, node_alive, bearer, me, exit=lambda _: os._exit(1))
