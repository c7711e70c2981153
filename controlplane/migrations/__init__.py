"""Alembic migration history of the catalog (``sr-controlplane migrate`` runs it; see docs/controlplane.md)."""
