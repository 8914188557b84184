"""The initial schema: jobs and steps, partitioned by (scope, namespace).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _key(length: int = 200) -> sa.types.TypeEngine[str]:
    # Byte-wise ordering on PostgreSQL, as SQLite and the memory provider order ids.
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "choreography_jobs",
        sa.Column("scope", _key(), nullable=False),
        sa.Column("namespace", _key(), nullable=False),
        sa.Column("id", _key(), nullable=False),
        sa.Column("type", _key(256), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("created", sa.BigInteger(), nullable=False),
        sa.Column("stop_finalized", sa.Boolean(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("scope", "namespace", "id", name="pk_choreography_jobs"),
    )
    jobs = "choreography_jobs"
    op.create_index("ix_choreography_jobs_status", jobs, ["scope", "namespace", "status"])
    op.create_index("ix_choreography_jobs_type", jobs, ["scope", "namespace", "type"])
    op.create_index(
        "ix_choreography_jobs_stop",
        jobs,
        ["scope", "namespace", "status", "stop_finalized"],
    )
    op.create_index("ix_choreography_jobs_created", jobs, ["scope", "namespace", "created"])

    op.create_table(
        "choreography_job_steps",
        sa.Column("scope", _key(), nullable=False),
        sa.Column("namespace", _key(), nullable=False),
        sa.Column("job_id", _key(), nullable=False),
        sa.Column("step_id", _key(), nullable=False),
        sa.Column("type", _key(256), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint(
            "scope", "namespace", "job_id", "step_id", name="pk_choreography_job_steps"
        ),
    )
    steps = "choreography_job_steps"
    op.create_index(
        "ix_choreography_job_steps_job_status",
        steps,
        ["scope", "namespace", "job_id", "status"],
    )
    # Every step query is per job, so status is indexed after the job id; a stand-alone status
    # or type index would be maintained on every step write and used by no query.


def downgrade() -> None:
    op.drop_table("choreography_job_steps")
    op.drop_table("choreography_jobs")
