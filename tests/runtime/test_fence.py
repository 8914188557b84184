"""A host's own fence (runtime/fence.py), without Ray: which evidence makes a host exit, and
that a control store that does not answer is no evidence."""

from __future__ import annotations

import threading

from choreography_ray.runtime.fence import Fence


def _fence(*, alive=True, bearer="me", parent=None, error=None):
    parents = parent if parent is not None else [100]
    exits: list[str] = []

    def node_alive():
        if error is not None:
            raise error
        return alive

    fence = Fence(
        "choreography:worker:n1",
        node_alive,
        lambda: bearer,
        "me",
        exit=exits.append,
        parent=lambda: parents[0],
        sleep=lambda _: None,
    )
    return fence, exits, parents


def test_a_host_of_a_live_node_that_bears_its_name_stays():
    fence, _, _ = _fence()
    assert fence.orphaned(100) is None
    assert fence.ask() is None


def test_a_host_whose_raylet_exited_leaves():
    fence, _, parents = _fence()
    parents[0] = 1  # re-parented to init
    assert "raylet is gone" in (fence.orphaned(100) or "")


def test_a_host_whose_node_ray_declared_dead_leaves():
    fence, _, _ = _fence(alive=False)
    assert "declared its node dead" in (fence.ask() or "")


def test_a_host_replaced_under_its_name_leaves():
    fence, _, _ = _fence(bearer="someone-else")
    assert "replaced" in (fence.ask() or "")


def test_no_answer_from_ray_is_no_evidence():
    fence, _, _ = _fence(error=TimeoutError("the GCS is restarting"))
    assert fence.ask() is None
    fence, _, _ = _fence(alive=None, bearer=None)  # node not listed, name not found
    assert fence.ask() is None


def test_the_fence_exits_once_with_its_reason():
    fence, exits, parents = _fence()
    done = threading.Event()
    fence._exit = lambda why: (exits.append(why), done.set())
    fence._sleep = lambda _: done.wait(0.01)
    fence.start()  # reads its parent: 100
    parents[0] = 1
    assert done.wait(5)
    fence.stop()
    assert len(exits) == 1 and "raylet" in exits[0]
