"""The one per-user cache root every build step shares (wheels, backend directories, jemalloc)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str) -> Path:
    """`$XDG_CACHE_HOME/sr-gateway/<name>` (default `~/.cache`), read at each call so tests can point it elsewhere."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sr-gateway" / name
