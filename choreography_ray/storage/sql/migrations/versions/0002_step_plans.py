"""Plans stored apart from their job, in chunks of consecutive entries, fenced by incarnation.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _key(length: int = 200) -> sa.types.TypeEngine[str]:
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "choreography_step_plans",
        sa.Column("scope", _key(), nullable=False),
        sa.Column("namespace", _key(), nullable=False),
        sa.Column("job_id", _key(), nullable=False),
        sa.Column("incarnation", sa.BigInteger(), nullable=False),
        sa.Column("chunk", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("entries", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint(
            "scope",
            "namespace",
            "job_id",
            "incarnation",
            "chunk",
            name="pk_choreography_step_plans",
        ),
    )


def downgrade() -> None:
    op.drop_table("choreography_step_plans")
