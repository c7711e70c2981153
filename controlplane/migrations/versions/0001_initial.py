"""Initial catalog schema: exactly what the pre-Alembic migrator's version 1 created.

Frozen DDL (not ``metadata.create_all``), so this revision keeps producing the version-1 schema after the
table definitions in controlplane/db.py move on.

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


def upgrade() -> None:
    """Create engines, models, artifacts and deployments with their indexes."""
    op.create_table(
        "engines",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("project_id", sa.String(64), nullable=True),
        sa.Column("runtime", sa.String(64), nullable=False),
        sa.Column("backend_type", sa.String(64), nullable=False),
        sa.Column("config_name", sa.String(255), nullable=False),
        sa.Column("model_format", sa.String(64), nullable=True),
        sa.Column("image", sa.Text, nullable=True),
        sa.Column("command", sa.JSON, nullable=True),
        sa.Column("args", sa.JSON, nullable=True),
        sa.Column("env", sa.JSON, nullable=True),
        sa.Column("resources", sa.JSON, nullable=True),
        sa.Column("engine_yaml", sa.Text, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "models",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("project_id", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "artifacts",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("project_id", sa.String(64), nullable=True),
        sa.Column("model_id", sa.String(64), nullable=True),
        sa.Column("uri", sa.Text, nullable=False),
        sa.Column("ready", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("lora", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "deployments",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("description", sa.Text, nullable=False, server_default=""),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("stopped", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("project_name", sa.String(255), nullable=True),
        sa.Column("domain_id", sa.String(64), nullable=True),
        sa.Column("domain_name", sa.String(255), nullable=True),
        sa.Column("owner_user_id", sa.String(64), nullable=False),
        sa.Column("owner_name", sa.String(255), nullable=True),
        sa.Column("k8s_name", sa.String(63), nullable=False),
        sa.Column("backend_catalog", sa.String(16), nullable=True),
        sa.Column("backend_type", sa.String(64), nullable=True),
        sa.Column("backend_uid", sa.String(64), nullable=True),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("labels", sa.JSON, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index(
        "uq_deployments_live_k8s_name",
        "deployments",
        ["project_id", "k8s_name"],
        unique=True,
        sqlite_where=sa.text("deleted_at IS NULL"),
        postgresql_where=sa.text("deleted_at IS NULL"),
    )
    op.create_index("ix_deployments_project", "deployments", ["project_id", "created_at"])


def downgrade() -> None:
    """Drop everything 0001 created."""
    op.drop_index("ix_deployments_project", table_name="deployments")
    op.drop_index("uq_deployments_live_k8s_name", table_name="deployments")
    for table in ("deployments", "artifacts", "models", "engines"):
        op.drop_table(table)
