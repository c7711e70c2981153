"""tritonserver's allocator (issue 23): jemalloc preloaded into tritonserver alone, never into its Python stubs.

glibc's malloc lets tritonserver's heap creep under varied traffic and jemalloc keeps it flat; a stub that inherits
the preload aborts with "double free or corruption" (docs/benchmarks.md "Memory under a soak"). These tests start a
real tritonserver, load MiniLM (so real stubs run) and read /proc/<pid>/maps of each process.
"""

from __future__ import annotations

import asyncio
from ctypes.util import find_library
from pathlib import Path

import pytest

from gateway import supervisor
from gateway.settings import Settings, SettingsError
from gateway.supervisor import AllocatorError, TritonProcess, stub_processes, triton_preload

ROOT = Path(__file__).resolve().parents[2]
MODEL = "all-minilm-l6-v2"
JEMALLOC = find_library("jemalloc")
# a glibc library neither tritonserver nor Python loads by itself: a preload the maps show without doubt
PROBE = find_library("anl")


def mapped(pid: int, library: str) -> bool:
    return library in Path("/proc", str(pid), "maps").read_text()


async def loaded_stack(preload: str | None) -> tuple[TritonProcess, list[int]]:
    """tritonserver over the built repository with MiniLM loaded: the process and its stubs' pids."""
    import tritonclient.grpc.aio as grpcaio

    process = TritonProcess(ROOT / "model_repository", threads=1, preload=preload)
    await process.start()
    client = grpcaio.InferenceServerClient(process.url)
    try:
        for _ in range(240):
            try:
                if await client.is_server_live():
                    break
            except Exception:
                pass
            await asyncio.sleep(0.25)
        await client.load_model(MODEL)
        assert await client.is_model_ready(MODEL)
    finally:
        await client.close()
    assert process.pgid is not None
    return process, [pid for pid, model, _ in stub_processes(process.pgid) if model == MODEL]


@pytest.mark.skipif(PROBE is None, reason="glibc's libanl is missing")
async def test_the_preload_reaches_tritonserver_and_no_python_stub() -> None:
    assert PROBE is not None
    process, stubs = await loaded_stack(PROBE)
    try:
        assert process.pgid is not None and mapped(process.pgid, PROBE)
        assert stubs and not any(mapped(pid, PROBE) for pid in stubs)
        assert all(Path("/proc", str(pid), "cmdline").read_bytes().split(b"\0")[0].endswith(supervisor.STUB.encode())
                   for pid in stubs)  # the wrapper keeps the stub's name: the supervisor still finds its stubs
    finally:
        await process.stop()


@pytest.mark.skipif(JEMALLOC is None or PROBE is None, reason="libjemalloc2 is not installed on this host")
async def test_tritonserver_runs_on_jemalloc_and_the_stubs_get_the_callers_own_preload_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert JEMALLOC is not None and PROBE is not None
    monkeypatch.setenv("LD_PRELOAD", PROBE)  # the caller's own preload, which the stubs must keep
    process, stubs = await loaded_stack(triton_preload("auto"))
    try:
        assert process.pgid is not None and mapped(process.pgid, "libjemalloc") and mapped(process.pgid, PROBE)
        assert stubs and all(mapped(pid, PROBE) and not mapped(pid, "libjemalloc") for pid in stubs)
    finally:
        await process.stop()


def test_auto_takes_jemalloc_where_installed_glibc_takes_nothing_and_an_unknown_allocator_is_refused() -> None:
    assert triton_preload("auto") == JEMALLOC
    assert triton_preload("glibc") is None
    with pytest.raises(AllocatorError, match="must be one of auto, jemalloc, glibc"):
        triton_preload("tcmalloc")


def test_jemalloc_required_where_it_is_missing_stops_the_start_with_the_setting_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "find_library", lambda name: None)
    assert triton_preload("auto") is None  # auto falls back to glibc's malloc
    with pytest.raises(AllocatorError, match="apt-get install libjemalloc2"):
        triton_preload("jemalloc")
    with pytest.raises(SettingsError, match="triton_allocator"):
        Settings(triton_allocator="jemalloc").validate()
    Settings(triton_allocator="jemalloc", triton_url="127.0.0.1:8001").validate()  # no child: nothing to preload
    with pytest.raises(SettingsError, match="must be auto, jemalloc or glibc"):
        Settings(triton_allocator="tcmalloc").validate()


def test_the_wrapped_and_the_plain_backend_directories_are_separate(tmp_path: Path) -> None:
    plain = supervisor.backend_directory(tmp_path)
    wrapped = supervisor.backend_directory(tmp_path, wrapped_stub=True)
    assert plain != wrapped
    assert (plain / "python" / supervisor.STUB).read_bytes()[:4] == b"\x7fELF"
    assert (wrapped / "python" / supervisor.STUB).read_text() == supervisor.STUB_WRAPPER
    assert (wrapped / "python" / f"{supervisor.STUB}.real").read_bytes()[:4] == b"\x7fELF"
