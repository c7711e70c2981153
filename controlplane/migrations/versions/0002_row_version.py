"""Row version on deployments: every write is a compare-and-set on it, so concurrent writers of one
deployment (PATCHes, stop/start, status refreshes) can no longer overwrite each other's changes.

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


def upgrade() -> None:
    """Existing rows start at version 0."""
    op.add_column("deployments", sa.Column("version", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("version")
