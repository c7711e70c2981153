"""Drop ``schema_version``, the pre-Alembic migrator's bookkeeping (a database it created was stamped 0001
on its first Alembic run; from then on ``alembic_version`` is the only record).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Only databases that came from the old migrator have the table."""
    if sa.inspect(op.get_bind()).has_table("schema_version"):
        op.drop_table("schema_version")


def downgrade() -> None:
    """Nothing to restore: the table only ever recorded version 1, which is revision 0001."""
