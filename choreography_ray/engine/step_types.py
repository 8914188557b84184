"""Each step's type, as the job tells its dispatcher: a step goes only to a worker host that
can run its type (a node may import one step type's module and not another's).

Kept small, as a job may hold a hundred thousand steps and most have steps of one type only:
the first type seen is the default, and only the steps of other types are listed.
"""

from __future__ import annotations


class StepTypes:
    """The step type of each of a job's steps."""

    __slots__ = ("default", "others")

    def __init__(self) -> None:
        self.default = ""
        """The type of the first step indexed: most steps' type ("" before any)."""
        self.others: dict[str, str] = {}
        """The steps whose type is not `default`."""

    def add(self, step_id: str, step_type: str) -> None:
        if not self.default:
            self.default = step_type
        elif step_type != self.default:
            self.others[step_id] = step_type
        else:
            self.others.pop(step_id, None)

    def of(self, step_id: str) -> str:
        """The step's type (`default` for a step not indexed)."""
        return self.others.get(step_id, self.default)

    @property
    def single(self) -> str | None:
        """The one type of every step, when they share one; None when they do not."""
        return None if self.others else self.default

    def names(self) -> list[str]:
        """Every type, the default first."""
        found = dict.fromkeys([self.default] if self.default else [])
        found.update(dict.fromkeys(self.others.values()))
        return list(found)
