"""Runs `tritonserver` (from the nvidia-pytriton wheel) as a supervised child process on loopback.

The wheel ships the server, the Python backend and one backend stub per Python version; Triton wants them in one
backend directory, so we assemble that directory outside site-packages (cached, keyed by wheel and Python version).

No orphans: tritonserver leads its own process group, which its Python-backend stubs inherit, and gets SIGTERM when
the gateway dies (PR_SET_PDEATHSIG). When tritonserver exits, whatever is left of its group is killed and the
shared-memory regions it named (a per-gateway prefix) are removed, so a restarted Triton starts clean.

Allocator: tritonserver itself runs on jemalloc where the host has it (`--triton-allocator`). Under glibc's
malloc its ≈ 10 MiB heap creeps by 3–9 % per 10 minutes of varied traffic (freed chunks fragmenting its arenas,
given back only by malloc_trim); on jemalloc the floor of its samples grew 0.3 % per 10 minutes, at about 10 MiB
more (docs/benchmarks.md "Memory under a soak"). The Python-backend stubs must not inherit the preload: each one
aborts at load with "double free or corruption" (memory taken from one allocator and freed to the other), so the
backend directory's stub is then a wrapper that restores the caller's own LD_PRELOAD before it execs the real stub.
jemalloc is the host's (Debian's libjemalloc2), else the copy `make models` extracted into a cache from the same
package (sr_build/jemalloc.py); the gateway only looks for it and never downloads.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import socket
import sys
import sysconfig
from collections.abc import Callable
from ctypes.util import find_library
from pathlib import Path

from sr_common.cache import cache_dir
from sr_common.tuned_config import CONFIG_NAME, ConfigError, refresh

log = logging.getLogger("sr_gateway.triton")

SHM = Path("/dev/shm")
STUB = "triton_python_backend_stub"
REAP_WAIT_S = 10.0  # longest wait for an exited Triton's group to be gone before a restart or `failed`
ALLOCATORS = ("auto", "jemalloc", "glibc")
JEMALLOC_PACKAGE = "libjemalloc2"  # Debian's package, and the name of its extracted tree in jemalloc_cache()
JEMALLOC_LIBRARY = "libjemalloc.so.2"
STUB_PRELOAD_ENV = "SR_GATEWAY_STUB_LD_PRELOAD"  # the caller's own LD_PRELOAD, given back to the stubs
# The stub's argv[0] stays the stub's path (`exec -a`): stub_processes() and Triton's own logs name it by that.
STUB_WRAPPER = f"""#!/bin/bash
# Written by sr-gateway: tritonserver runs with an allocator preloaded that this stub must not inherit.
if [ -n "${{{STUB_PRELOAD_ENV}:-}}" ]; then export LD_PRELOAD="${{{STUB_PRELOAD_ENV}}}"; else unset LD_PRELOAD; fi
exec -a "$0" "$(dirname "$0")/{STUB}.real" "$@"
"""


class AllocatorError(RuntimeError):
    pass


def jemalloc_cache() -> Path:
    """Where `make models` (sr_build/jemalloc.py) extracts Debian's libjemalloc2 on a host that lacks it."""
    return cache_dir("jemalloc")


def cached_jemalloc(cache: Path | None = None) -> Path | None:
    """The cache's extracted libjemalloc.so.2 (under usr/lib/<multiarch triplet>/), or None. Looks only."""
    found = sorted(((cache or jemalloc_cache()) / JEMALLOC_PACKAGE).glob(f"usr/lib/*/{JEMALLOC_LIBRARY}"))
    return found[0] if found else None


def triton_preload(allocator: str) -> str | None:
    """The library to preload into tritonserver: jemalloc's where the host has it or `make models` cached it
    (`auto`), required (`jemalloc`) or never (`glibc`)."""
    if allocator not in ALLOCATORS:
        raise AllocatorError(f"allocator must be one of {', '.join(ALLOCATORS)}, not {allocator!r}")
    if allocator == "glibc":
        return None
    # ldconfig's cache first (Debian's libjemalloc2 gives libjemalloc.so.2), then the copy `make models` fetched
    found = find_library("jemalloc") or (str(cached) if (cached := cached_jemalloc()) else None)
    if found is None and allocator == "jemalloc":
        raise AllocatorError(f"--triton-allocator jemalloc: {JEMALLOC_LIBRARY} is neither installed "
                             f"(Debian/Ubuntu: apt-get install {JEMALLOC_PACKAGE}) nor cached in "
                             f"{jemalloc_cache()} (`make models` fetches it there)")
    return found


def _pytriton_root() -> Path:
    import pytriton

    return Path(pytriton.__file__).resolve().parent / "tritonserver"


def backend_directory(cache: Path | None = None, *, wrapped_stub: bool = False) -> Path:
    """`<cache>/<key>/python/{libtriton_python.so, triton_python_backend_utils.py, triton_python_backend_stub}`;
    with `wrapped_stub` the stub is STUB_WRAPPER in front of the real one (`<stub>.real`), in its own directory."""
    root = _pytriton_root()
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / pyver / STUB
    if not stub.is_file():
        raise RuntimeError(f"nvidia-pytriton has no Python backend stub for Python {pyver}")
    lib = root / "backends" / "python" / "libtriton_python.so"
    wrapper = hashlib.sha256(STUB_WRAPPER.encode()).hexdigest()[:8] if wrapped_stub else "plain"
    key = hashlib.sha256(f"{lib.stat().st_size}:{lib.stat().st_mtime_ns}:{pyver}:{root}:{wrapper}".encode()
                         ).hexdigest()[:16]
    base = cache or cache_dir("backends")
    target = base / key / "python"
    if not (target / STUB).is_file():
        tmp = target.with_name(f"python.tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, tmp / lib.name)
        shutil.copy2(root / "backends" / "python" / "triton_python_backend_utils.py", tmp)
        if wrapped_stub:
            shutil.copy2(stub, tmp / f"{STUB}.real")
            (tmp / STUB).write_text(STUB_WRAPPER)
            (tmp / STUB).chmod(0o755)
        else:
            shutil.copy2(stub, tmp / STUB)
        os.replace(tmp, target)
    return target.parent


def refresh_generated_configs(repository: Path) -> None:
    """A generated config made from an older config.pbtxt gets the current one with the same tuned choice, so an
    edit of config.pbtxt is never hidden behind a stale copy (a read-only repository is logged, not fatal)."""
    try:
        refreshed = refresh(repository)
    except (OSError, ConfigError) as exc:
        log.warning("could not refresh the generated model configs in %s: %s", repository, exc)
        return
    if refreshed:
        log.info("regenerated configs/%s.pbtxt from an edited config.pbtxt: %s", CONFIG_NAME, ", ".join(refreshed))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_environment(threads: int, preload: str | None = None) -> dict[str, str]:
    """Library and module paths for tritonserver and the stub's embedded interpreter, and tritonserver's allocator
    (`preload`, ahead of the caller's own LD_PRELOAD, which the wrapped stubs get back alone)."""
    env = dict(os.environ)
    if preload is not None:
        env[STUB_PRELOAD_ENV] = env.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = " ".join(p for p in (preload, env.get("LD_PRELOAD", "")) if p)
    libs = [str(Path(sysconfig.get_paths()["platlib"]) / "nvidia_pytriton.libs")]
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir and Path(libdir, f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0").exists():
        libs.append(libdir)  # the stub then embeds this very interpreter build, not a system one
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
    project_root = Path(__file__).resolve().parent.parent
    paths = dict.fromkeys([str(project_root), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env["SR_BACKEND_PYTHONPATH"] = os.pathsep.join(paths)
    if threads:
        env["SR_BACKEND_THREADS"] = str(threads)
    return env


def _die_with_parent() -> list[str]:
    """Linux: Triton gets SIGTERM if the gateway dies without cleaning up (e.g. SIGKILL). Set by util-linux's
    `setpriv --pdeathsig` between fork and exec, not by a `preexec_fn`: Python code between fork and exec in a
    process with threads (asyncio's to_thread pool, gRPC's) can deadlock on a lock another thread held."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError("setpriv (util-linux) is required to start tritonserver as a child")
    return [setpriv, "--pdeathsig", "TERM", "--"]


def _shm_prefix(pid: int, port: int) -> str:
    return f"srgw-{pid}-{port}-"


def remove_stale_shm() -> list[str]:
    """Regions named by an earlier gateway that no longer exists (killed before it could clean up)."""
    removed = []
    for path in SHM.glob("srgw-*-*-*"):
        owner = path.name.split("-")[1]
        if owner.isdigit() and not Path("/proc", owner).exists():
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
    return removed


def _in_group(pid: int, pgid: int) -> bool:
    """The process is alive (not a zombie) and in the group."""
    try:
        stat = Path("/proc", str(pid), "stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
    return fields[0] != "Z" and int(fields[2]) == pgid


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group (a scan of /proc: milliseconds)."""
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and _in_group(int(e.name), pgid)]


def still_in_group(pids: set[int], pgid: int) -> set[int]:
    """Those of `pids` still alive in the group (reads only their own /proc entries)."""
    return {pid for pid in pids if _in_group(pid, pgid)}


def stub_processes(pgid: int) -> list[tuple[int, str, str]]:
    """(pid, Triton model name, instance name) of each live Python-backend stub in the group
    (stub argv: model.py path … instance name …)."""
    found = []
    for pid in group_members(pgid):
        try:
            argv = Path("/proc", str(pid), "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 8 and argv[0].endswith(STUB.encode()):
            found.append((pid, Path(argv[1].decode()).parent.parent.name, argv[8].decode()))
    return found


def stub_instances(pgid: int) -> dict[str, list[str]]:
    """Triton model name → live Python-backend instances."""
    found: dict[str, list[str]] = collections.defaultdict(list)
    for _, model, instance in stub_processes(pgid):
        found[model].append(instance)
    return dict(found)


class TritonProcess:
    def __init__(self, repository: Path, *, grpc_port: int = 0, threads: int = 0, metrics_port: int = 0,
                 metrics_address: str = "127.0.0.1", exit_timeout_s: int = 30, preload: str | None = None,
                 on_exit: Callable[[int], None] | None = None) -> None:
        self.repository = repository
        self.preload = preload  # triton_preload(): tritonserver's allocator library, None for glibc's
        self.grpc_port = grpc_port or free_port()
        self.metrics_port = metrics_port  # 0: Triton's Prometheus endpoint stays off
        self.metrics_address = metrics_address
        self.threads = threads
        self.exit_timeout_s = exit_timeout_s  # how long tritonserver lets in-flight inferences finish on SIGTERM
        self.on_exit = on_exit
        self.proc: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        self.shm_prefix = _shm_prefix(os.getpid(), self.grpc_port)
        self.exited: asyncio.Future[int] | None = None
        self._stubs: dict[int, tuple[str, str]] = {}

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None  # setsid(): the leader's pid is the group id

    def arguments(self) -> list[str]:
        """tritonserver's flags but the backend directory: one list, so a manifest that runs `sr-gateway triton`
        can be checked for what Triton really gets."""
        return [
            f"--model-repository={self.repository}",
            # each model's configs/<CONFIG_NAME>.pbtxt (this host's tuned choice) where one was generated
            f"--model-config-name={CONFIG_NAME}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
            "--allow-http=false",
            *(["--allow-metrics=true", f"--metrics-address={self.metrics_address}",
               f"--metrics-port={self.metrics_port}", "--allow-gpu-metrics=false"]
              if self.metrics_port else ["--allow-metrics=false"]),
            "--model-control-mode=explicit",
            "--strict-readiness=true", f"--exit-timeout-secs={self.exit_timeout_s}",
            "--log-verbose=0", "--log-info=false",
            "--pinned-memory-pool-byte-size=0",  # CPU-only: no CUDA pinned pool to allocate
        ]

    async def start(self) -> None:
        binary = _pytriton_root() / "bin" / "tritonserver"
        refresh_generated_configs(self.repository)
        remove_stale_shm()
        self.cleanup_shm()
        backends = backend_directory(wrapped_stub=self.preload is not None)
        args = [*_die_with_parent(), str(binary), f"--backend-directory={backends}", *self.arguments()]
        log.info("starting tritonserver on %s (allocator: %s)", self.url, self.preload or "glibc malloc")
        self._stopping = False
        self.exited = asyncio.get_running_loop().create_future()
        self.proc = await asyncio.create_subprocess_exec(
            *args, env=child_environment(self.threads, self.preload), stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() signals Triton and its stubs together
        )
        self._watch = asyncio.create_task(self._wait())

    async def _wait(self) -> None:
        assert self.proc is not None and self.exited is not None
        code = await self.proc.wait()
        self.reap()
        if not self.exited.done():
            self.exited.set_result(code)
        if not self._stopping:
            log.error("tritonserver exited unexpectedly with code %s", code)
            if self.on_exit is not None:
                self.on_exit(code)

    def reap(self) -> None:
        """Kill what is left of tritonserver's group (its stubs) and remove its shared-memory regions."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.cleanup_shm()

    async def gone(self) -> list[int]:
        """Wait until nothing of the exited tritonserver's group is alive; what is still alive after REAP_WAIT_S.
        SIGKILL is delivered asynchronously: a stub tearing down a gigabyte of mappings stays a live process for
        a while after killpg returns (tens of milliseconds, longer on a busy host). The supervisor waits here
        before it restarts Triton or gives up, so neither happens while the old stubs still hold memory; a
        process stuck in the kernel is logged, not waited for forever."""
        if self.proc is None:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REAP_WAIT_S
        while (left := group_members(self.proc.pid)) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if left:
            log.warning("%d process(es) of the exited tritonserver still alive after %.0f s: %s",
                        len(left), REAP_WAIT_S, left)
        self.cleanup_shm()
        return left

    def cleanup_shm(self) -> list[str]:
        removed = []
        for path in SHM.glob(self.shm_prefix + "*"):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
        if removed:
            log.info("removed %d leftover shared-memory regions of tritonserver", len(removed))
        return removed

    def instances(self) -> dict[str, list[str]]:
        """Triton model → live stub instances. Scanning /proc costs milliseconds on the event loop, so the stubs
        are remembered and only their own /proc entries read, until one is gone or `forget_stubs()`."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return {}
        if not self._stubs or not all(_in_group(pid, proc.pid) for pid in self._stubs):
            self._stubs = {pid: (model, instance) for pid, model, instance in stub_processes(proc.pid)}
        found: dict[str, list[str]] = collections.defaultdict(list)
        for model, instance in self._stubs.values():
            found[model].append(instance)
        return dict(found)

    def forget_stubs(self) -> None:
        """A model was (re)loaded: its stubs are new, the next `instances()` scans."""
        self._stubs = {}

    def stub_pids(self, model: str) -> set[int]:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return set()
        return {pid for pid, name, _ in stub_processes(proc.pid) if name == model}

    def kill(self) -> None:
        """SIGKILL tritonserver (its watcher then reaps the group and reports the exit)."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def stop(self, timeout: float = 30.0) -> None:
        self._stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
            if self._watch is not None:
                await self._watch
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            log.warning("tritonserver did not stop within %.0f s; killing it", timeout)
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        if self._watch is not None:
            await self._watch
