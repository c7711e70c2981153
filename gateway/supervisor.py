"""Runs `tritonserver` (from the nvidia-pytriton wheel) as a supervised child process on loopback.

The wheel ships the server, the Python backend and one backend stub per Python version; Triton wants them in one
backend directory, so we assemble that directory outside site-packages (cached, keyed by wheel and Python version).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import signal
import socket
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("sr_gateway.triton")

PR_SET_PDEATHSIG = 1


def _pytriton_root() -> Path:
    import pytriton

    return Path(pytriton.__file__).resolve().parent / "tritonserver"


def backend_directory(cache: Path | None = None) -> Path:
    """`<cache>/<key>/python/{libtriton_python.so, triton_python_backend_utils.py, triton_python_backend_stub}`."""
    root = _pytriton_root()
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / pyver / "triton_python_backend_stub"
    if not stub.is_file():
        raise RuntimeError(f"nvidia-pytriton has no Python backend stub for Python {pyver}")
    lib = root / "backends" / "python" / "libtriton_python.so"
    key = hashlib.sha256(f"{lib.stat().st_size}:{lib.stat().st_mtime_ns}:{pyver}:{root}".encode()).hexdigest()[:16]
    base = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sr-gateway" / "backends"
    target = base / key / "python"
    if not (target / "triton_python_backend_stub").is_file():
        tmp = target.with_name(f"python.tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, tmp / lib.name)
        shutil.copy2(root / "backends" / "python" / "triton_python_backend_utils.py", tmp)
        shutil.copy2(stub, tmp / stub.name)
        os.replace(tmp, target)
    return target.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_environment(threads: int) -> dict[str, str]:
    """Library and module paths for tritonserver and the stub's embedded interpreter."""
    env = dict(os.environ)
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


def _die_with_parent() -> None:
    """Linux: Triton gets SIGTERM if the gateway dies without cleaning up (e.g. SIGKILL)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    os.setsid()


class TritonProcess:
    def __init__(self, repository: Path, *, grpc_port: int = 0, threads: int = 0,
                 on_exit: Callable[[int], None] | None = None) -> None:
        self.repository = repository
        self.grpc_port = grpc_port or free_port()
        self.threads = threads
        self.on_exit = on_exit
        self.proc: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    async def start(self) -> None:
        binary = _pytriton_root() / "bin" / "tritonserver"
        args = [
            str(binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={backend_directory()}",
            "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
            "--allow-http=false", "--allow-metrics=false",
            "--model-control-mode=explicit",
            "--strict-readiness=true", "--exit-timeout-secs=30",
            "--log-verbose=0", "--log-info=false",
            "--pinned-memory-pool-byte-size=0",  # CPU-only: no CUDA pinned pool to allocate
        ]
        log.info("starting tritonserver on %s", self.url)
        self.proc = await asyncio.create_subprocess_exec(
            *args, env=child_environment(self.threads), stdin=asyncio.subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        self._watch = asyncio.create_task(self._wait())

    async def _wait(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        if not self._stopping:
            log.error("tritonserver exited unexpectedly with code %s", code)
            if self.on_exit is not None:
                self.on_exit(code)

    async def stop(self, timeout: float = 30.0) -> None:
        self._stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
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
