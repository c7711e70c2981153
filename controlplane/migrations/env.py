"""Alembic environment: always driven programmatically by :func:`controlplane.db.migrate`, which passes an
open synchronous connection (inside its transaction and, on PostgreSQL, under an advisory lock)."""

from __future__ import annotations

from alembic import context

from controlplane.db import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
