"""Steps listed in plan order and by last change, a page at a time.

Revision ID: 0003
Revises: 0002

Records of earlier releases keep position 0 (their stage lists by id, as before) and last
change 0 (they list last by last change until their next write).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_STEPS = "choreography_job_steps"


def upgrade() -> None:
    op.add_column(_STEPS, sa.Column("position", sa.Integer(), nullable=False, server_default="0"))
    op.add_column(_STEPS, sa.Column("changed", sa.BigInteger(), nullable=False, server_default="0"))
    op.create_index(
        "ix_choreography_job_steps_plan_order",
        _STEPS,
        ["scope", "namespace", "job_id", "stage", "position", "step_id"],
    )
    op.create_index(
        "ix_choreography_job_steps_changed",
        _STEPS,
        ["scope", "namespace", "job_id", "changed", "step_id"],
    )


def downgrade() -> None:
    op.drop_index("ix_choreography_job_steps_changed", table_name=_STEPS)
    op.drop_index("ix_choreography_job_steps_plan_order", table_name=_STEPS)
    with op.batch_alter_table(_STEPS) as batch:
        batch.drop_column("changed")
        batch.drop_column("position")
