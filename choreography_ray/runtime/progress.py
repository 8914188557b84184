"""A live progress bar for a job, on a terminal."""

from __future__ import annotations

from types import TracebackType

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from ..jobs.state import JobState


class ProgressBar:
    """Shows a job's counted outcomes against its total; does nothing when disabled."""

    def __init__(self, enabled: bool = True, description: str = "job") -> None:
        self.enabled = enabled
        self.description = description
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> ProgressBar:
        return self

    def _start(self) -> Progress:
        """The bar appears with the job's first state: a job that is not found draws none."""
        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=None, detail="")
        return self._progress

    def update(self, state: JobState) -> None:
        if not self.enabled:
            return
        progress = self._start()
        assert self._task is not None
        p = state.progress
        done = p.done_steps
        detail = f"{state.status.name.lower()}  ok {p.successful_steps}  failed {p.failed_steps}"
        if p.stopped_steps:
            detail += f"  stopped {p.stopped_steps}"
        progress.update(self._task, total=p.total_steps or None, completed=done, detail=detail)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
