"""The catalog as the rest of the control plane uses it: the only place besides :mod:`controlplane.db` that runs
SQL. Callers get typed records (:mod:`.records`) from named queries (:mod:`.deployments`, :mod:`.catalog`)."""

from controlplane.store.deployments import WRITE_ATTEMPTS, CatalogReads, DeploymentStore, StaleRow, visible
from controlplane.store.records import (
    DELETING,
    ArtifactRecord,
    DeploymentRecord,
    EngineRecord,
    ModelRecord,
    namespace,
    require_kind,
    visible_project,
    workload_kind,
)

__all__ = [
    "DELETING", "WRITE_ATTEMPTS", "ArtifactRecord", "CatalogReads", "DeploymentRecord", "DeploymentStore",
    "EngineRecord", "ModelRecord", "StaleRow", "namespace", "require_kind", "visible", "visible_project",
    "workload_kind",
]
