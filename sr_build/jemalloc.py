"""jemalloc for tritonserver on a host without Debian's libjemalloc2: `make models` fetches the package into a cache.

Under glibc's malloc tritonserver's heap creeps with varied traffic; the gateway preloads jemalloc into it where it
finds the library (gateway/supervisor.py, triton_preload). jemalloc is not on PyPI, so on a fresh host without the
package `make serve` would run Triton on glibc's malloc. Here `apt-get update` into a private lists directory (the
host's sources, never its own lists), `apt-get download libjemalloc2` (apt checks the .deb against its signed index;
no root needed) and `dpkg-deb -x` put the library under jemalloc_cache(), where triton_preload looks for it. A
failure is a warning, never a failed build: Triton then runs on glibc's malloc.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from ctypes.util import find_library
from pathlib import Path

from gateway.supervisor import JEMALLOC_LIBRARY, JEMALLOC_PACKAGE, cached_jemalloc, jemalloc_cache
from sr_build.sources import sha256_file

log = logging.getLogger("sr_build.jemalloc")

MANIFEST = "manifest.txt"  # beside usr/ in the extracted tree: the .deb's name and sha256, the library's sha256
DOWNLOAD_TIMEOUT_S = 300
EXTRACT_TIMEOUT_S = 60


def _run(argv: list[str], cwd: Path, timeout_s: float) -> None:
    subprocess.run(argv, cwd=cwd, check=True, timeout=timeout_s, stdin=subprocess.DEVNULL, capture_output=True,
                   text=True)


def _download(base: Path) -> Path:
    """apt-get download + dpkg-deb -x in a temporary directory under `base`, moved to `base/<package>` at once."""
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} is not on PATH")
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{JEMALLOC_PACKAGE}.tmp", dir=base) as tmp:
        work = Path(tmp)
        # apt's own index, fetched into this temporary directory (a fresh host's lists are often empty, and the
        # host's are never touched): no root, no lock shared with another apt, signatures checked by apt
        private = ["-q", "-o", f"Dir::State::Lists={work / 'lists'}", "-o", f"Dir::Cache={work / 'apt-cache'}"]
        for directory in ("lists/partial", "apt-cache/archives/partial"):
            (work / directory).mkdir(parents=True)
        _run(["apt-get", *private, "update"], work, DOWNLOAD_TIMEOUT_S)
        _run(["apt-get", *private, "download", JEMALLOC_PACKAGE], work, DOWNLOAD_TIMEOUT_S)
        debs = sorted(work.glob(f"{JEMALLOC_PACKAGE}_*.deb"))
        if not debs:
            raise FileNotFoundError(f"apt-get download left no {JEMALLOC_PACKAGE}_*.deb")
        tree = work / JEMALLOC_PACKAGE
        _run(["dpkg-deb", "-x", str(debs[0]), str(tree)], work, EXTRACT_TIMEOUT_S)
        library = cached_jemalloc(work)
        if library is None:
            raise FileNotFoundError(f"{debs[0].name} holds no usr/lib/*/{JEMALLOC_LIBRARY}")
        (tree / MANIFEST).write_text(f"deb {debs[0].name}\nsha256 {sha256_file(debs[0])}\n"
                                     f"library {library.relative_to(tree)}\nlibrary_sha256 {sha256_file(library)}\n")
        target = base / JEMALLOC_PACKAGE
        if cached_jemalloc(base) is None:  # else a concurrent fetch came first: its tree stays
            shutil.rmtree(target, ignore_errors=True)  # a tree without the library (damaged): replaced whole
            os.replace(tree, target)
    if (found := cached_jemalloc(base)) is None:
        raise FileNotFoundError(f"{base / JEMALLOC_PACKAGE} holds no {JEMALLOC_LIBRARY}")
    return found


def fetch(cache: Path | None = None) -> Path | None:
    """The cached libjemalloc.so.2, fetched from Debian's libjemalloc2 if not cached yet; None where the system has
    the library (triton_preload takes that) or where the fetch fails (logged: Triton then runs on glibc's malloc)."""
    if find_library("jemalloc") is not None:
        return None
    base = cache or jemalloc_cache()
    if (found := cached_jemalloc(base)) is not None:
        return found
    try:
        return _download(base)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not fetch %s into %s (%s%s): tritonserver will run on glibc's malloc, whose memory "
                    "creeps under varied traffic; fix: apt-get install %s (then nothing is fetched)",
                    JEMALLOC_PACKAGE, base, exc, _errors(exc), JEMALLOC_PACKAGE)
        return None


def _errors(exc: BaseException) -> str:
    """apt's own error lines (`E: ...`, else its last line) from a failed command's stderr."""
    stderr = getattr(exc, "stderr", None) or ""
    lines = [line.strip() for line in (stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
                                       ).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E:")] or lines[-1:]
    return f": {' '.join(errors)}" if errors else ""


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if (system := find_library("jemalloc")) is not None:
        print(f"jemalloc: the system has {system}; nothing to fetch")
        return 0
    cached = cached_jemalloc()
    found = fetch()
    print(f"jemalloc: {'already cached' if cached else 'fetched'}: {found} (tritonserver preloads it)"
          if found is not None else "jemalloc: not available; tritonserver runs on glibc's malloc")
    return 0  # never fails `make models`


if __name__ == "__main__":
    raise SystemExit(main())
