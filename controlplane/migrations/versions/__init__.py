"""Revisions, oldest first: 0001 reproduces the schema the pre-Alembic migrator created."""
