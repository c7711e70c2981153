"""A content-addressed store of what `sr-gateway models build` made, shared by every checkout on the machine.

Each build step already keys its result (the export by its sources' digests, recipe and exporter versions; the tune
by the host's CPU and the graph; the preset heads by their data, code revision and reader) and compares that key with
a stamp in the checkout. A fresh clone has no stamps, so it redid all of it: about 22 minutes on the 2-core CI
machine (ONNX exports, the tuner's measurements, the LM reading 3,000 prompts for the heads). The store keeps each
step's files under the sha256 of the same key, so a checkout whose stamp is missing or stale takes them from the
store when an identical step ran before on this machine, and every step whose result is current is published.

Safety, since a wrong artefact would be served:
- an entry is written under a temporary name and renamed into place, so a reader never sees half of one;
- its manifest records the key itself and every file's sha256, size and mtime; a fetch checks the key and every
  digest before it copies anything, and drops an entry that fails (a miss, never a wrong file);
- files are restored under a temporary name, then renamed in the manifest's order, the step's stamp last, so an
  interrupted restore leaves no stamp that vouches for it; mtimes are kept (int8 copies record their source's).
- The store is capped (`--store-max-gib`, 12 GiB by default: about four generations of this repository's 2.9 GB of
  artefacts); the least recently used entries go first, and an entry larger than the cap is not kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sr_common.cache import cache_dir

from .sources import sha256_file

STORE_FORMAT = 1
DEFAULT_MAX_GIB = 12.0
OFF = ("", "off", "none")
_STALE_TMP_S = 6 * 3600  # a temporary entry this old belongs to a publish that died


def key_digest(step: str, key: dict[str, Any]) -> str:
    """The entry's name: the sha256 of the step and its key, in canonical JSON."""
    return hashlib.sha256(json.dumps([STORE_FORMAT, step, key], sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class ModelStore:
    root: Path
    max_bytes: int

    @classmethod
    def from_setting(cls, value: str | None, max_gib: float = DEFAULT_MAX_GIB) -> ModelStore | None:
        """The store a `--store` value names (None: the per-user cache; "", "off" or "none": no store)."""
        if value is not None and value.strip().lower() in OFF:
            return None
        return cls(Path(value) if value else cache_dir("models"), int(max_gib * (1 << 30)))

    def _entry(self, step: str, key: dict[str, Any]) -> Path:
        return self.root / step / key_digest(step, key)

    def has(self, step: str, key: dict[str, Any]) -> bool:
        return (self._entry(step, key) / "manifest.json").is_file()

    def fetch(self, step: str, key: dict[str, Any], into: Path) -> bool:
        """Restore the entry for (step, key) under `into`; False (and nothing written) when there is none or it
        fails its check, in which case it is dropped."""
        entry = self._entry(step, key)
        try:
            manifest = json.loads((entry / "manifest.json").read_text())
        except (OSError, ValueError):
            return False
        files: list[dict[str, Any]] = manifest.get("files", [])
        try:
            ok = manifest.get("key") == key and manifest.get("format") == STORE_FORMAT and all(
                (entry / "files" / f["name"]).stat().st_size == f["size"]
                and sha256_file(entry / "files" / f["name"]) == f["sha256"] for f in files)
        except OSError:
            ok = False
        if not ok:
            print(f"model store: dropping {entry} (it does not match its manifest)", file=sys.stderr)
            shutil.rmtree(entry, ignore_errors=True)
            return False
        partial = []
        try:
            for f in files:
                target = into / f["name"]
                target.parent.mkdir(parents=True, exist_ok=True)
                temporary = target.with_name(target.name + ".store-partial")
                shutil.copyfile(entry / "files" / f["name"], temporary)
                os.utime(temporary, ns=(f["mtime_ns"], f["mtime_ns"]))
                partial.append((temporary, target))
            for temporary, target in partial:  # the manifest's order: the step's stamp is last
                temporary.replace(target)
        except OSError as exc:
            for temporary, _ in partial:
                temporary.unlink(missing_ok=True)
            print(f"model store: could not restore {entry}: {exc}", file=sys.stderr)
            return False
        with contextlib.suppress(OSError):
            os.utime(entry)  # recently used: evicted last
        return True

    def publish(self, step: str, key: dict[str, Any], base: Path, names: Sequence[str], *,
                replace: bool = False) -> bool:
        """Keep `names` (paths under `base`, the step's stamp last) as the entry for (step, key), unless it is
        there already (`replace`: the step just ran, e.g. a forced measurement, and its result supersedes the
        entry) or larger than the cap; True if the store now holds it. A failure only warns: the store saves
        time, the build never depends on it."""
        if self.has(step, key) and not replace:
            with contextlib.suppress(OSError):
                os.utime(self._entry(step, key))
            return True
        paths = [base / name for name in names]
        try:
            size = sum(p.stat().st_size for p in paths)
        except OSError as exc:
            print(f"model store: not keeping {step} ({exc})", file=sys.stderr)
            return False
        if size > self.max_bytes:
            print(f"model store: not keeping {step}: {size} bytes exceed the store's cap of {self.max_bytes}",
                  file=sys.stderr)
            return False
        entry = self._entry(step, key)
        temporary = self.root / f".tmp-{os.getpid()}-{time.monotonic_ns()}"
        try:
            (temporary / "files").mkdir(parents=True)
            files = []
            for name, path in zip(names, paths, strict=True):
                copy = temporary / "files" / name
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, copy)
                stat = path.stat()
                files.append({"name": name, "sha256": sha256_file(copy), "size": stat.st_size,
                              "mtime_ns": stat.st_mtime_ns})
            (temporary / "manifest.json").write_text(json.dumps(
                {"format": STORE_FORMAT, "step": step, "key": key, "files": files}, indent=1))
            entry.parent.mkdir(parents=True, exist_ok=True)
            if replace and entry.exists():  # moved aside first: a reader sees the old entry, then none, then this
                old = self.root / f".tmp-old-{os.getpid()}-{time.monotonic_ns()}"
                entry.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            temporary.rename(entry)
        except OSError as exc:
            shutil.rmtree(temporary, ignore_errors=True)
            if not self.has(step, key):  # another build may have published the same entry first
                print(f"model store: could not keep {step}: {exc}", file=sys.stderr)
                return False
        self.evict(keep=entry)
        return True

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last used, bytes, path) of every entry."""
        found = []
        for manifest in self.root.glob("*/*/manifest.json"):
            if manifest.parent.parent.name.startswith("."):
                continue
            try:
                files = json.loads(manifest.read_text()).get("files", [])
                found.append((manifest.parent.stat().st_mtime, sum(int(f["size"]) for f in files), manifest.parent))
            except (OSError, ValueError, KeyError, TypeError):
                found.append((0.0, 0, manifest.parent))  # unreadable: first to go
        return found

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Drop least recently used entries until the store fits its cap, and temporary entries of dead
        publishes; the entries dropped."""
        now = time.time()
        for stale in self.root.glob(".tmp-*"):
            with contextlib.suppress(OSError):
                if now - stale.stat().st_mtime > _STALE_TMP_S:
                    shutil.rmtree(stale, ignore_errors=True)
        found = sorted(self.entries())
        total = sum(size for _, size, _ in found)
        dropped = []
        for _, size, path in found:
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            shutil.rmtree(path, ignore_errors=True)
            total -= size
            dropped.append(path)
        return dropped
