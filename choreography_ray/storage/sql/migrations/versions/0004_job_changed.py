"""Jobs filtered and listed by last change.

Revision ID: 0004
Revises: 0003

Each job row gains its last change (microseconds since the epoch), read once from the record's
status history for the rows of earlier releases (the latest of creation and last status
change), then kept by every write.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from choreography_ray.storage.job_order import stored_change

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_JOBS = "choreography_jobs"
_BATCH = 1_000


def upgrade() -> None:
    op.add_column(_JOBS, sa.Column("changed", sa.BigInteger(), nullable=False, server_default="0"))
    _backfill()
    op.create_index("ix_choreography_jobs_changed", _JOBS, ["scope", "namespace", "changed", "id"])


def _backfill() -> None:
    jobs = sa.table(
        _JOBS,
        sa.column("scope"),
        sa.column("namespace"),
        sa.column("id"),
        sa.column("created"),
        sa.column("state"),
        sa.column("changed"),
    )
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(jobs.c.scope, jobs.c.namespace, jobs.c.id, jobs.c.created, jobs.c.state)
    ).all()
    update = (
        jobs.update()
        .where(
            jobs.c.scope == sa.bindparam("s"),
            jobs.c.namespace == sa.bindparam("n"),
            jobs.c.id == sa.bindparam("i"),
        )
        .values(changed=sa.bindparam("c"))
    )
    values = [
        {"s": scope, "n": namespace, "i": job_id, "c": stored_change(state, created)}
        for scope, namespace, job_id, created, state in rows
    ]
    for start in range(0, len(values), _BATCH):
        connection.execute(update, values[start : start + _BATCH])


def downgrade() -> None:
    op.drop_index("ix_choreography_jobs_changed", table_name=_JOBS)
    with op.batch_alter_table(_JOBS) as batch:
        batch.drop_column("changed")
