"""Live status on deployments: the reconciler stores KServe's Ready value and conditions next to status and
endpoint, so the catalog holds the whole last-known live view (not only what a detail call refreshed).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("deployments", sa.Column("ready", sa.String(16), nullable=True))
    op.add_column("deployments", sa.Column("conditions", sa.JSON, nullable=True))
    op.add_column("deployments", sa.Column("observed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        for column in ("observed_at", "conditions", "ready"):
            batch.drop_column(column)
