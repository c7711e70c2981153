"""tritonserver's allocator (issue 23): jemalloc preloaded into tritonserver alone, never into its Python stubs.

glibc's malloc lets tritonserver's heap creep under varied traffic and jemalloc keeps it flat; a stub that inherits
the preload aborts with "double free or corruption" (docs/benchmarks.md "Memory under a soak"). These tests start a
real tritonserver, load MiniLM (so real stubs run) and read /proc/<pid>/maps of each process. On a host without
the package, `make models` fetches Debian's libjemalloc2 into a cache (sr_build/jemalloc.py): those tests run the
real `apt-get download` with the system's own copy hidden from the lookup.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import sys
from collections.abc import Iterator
from ctypes.util import find_library
from pathlib import Path

import pytest

from gateway import supervisor
from gateway.settings import Settings, SettingsError
from gateway.supervisor import AllocatorError, TritonProcess, cached_jemalloc, stub_processes, triton_preload
from sr_build import jemalloc
from sr_build.sources import sha256_file

ROOT = Path(__file__).resolve().parents[2]
MODEL = "all-minilm-l6-v2"
JEMALLOC = triton_preload("auto")  # the system's library, else the copy `make models` fetched into the cache
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


@pytest.mark.skipif(JEMALLOC is None or PROBE is None, reason="libjemalloc2 is neither installed nor cached")
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
    assert triton_preload("auto") == find_library("jemalloc") or triton_preload("auto") == str(cached_jemalloc())
    assert triton_preload("glibc") is None
    with pytest.raises(AllocatorError, match="must be one of auto, jemalloc, glibc"):
        triton_preload("tcmalloc")


def test_jemalloc_required_where_it_is_missing_stops_the_start_with_the_setting_named(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(supervisor, "find_library", lambda name: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nor a copy cached by `make models`
    assert triton_preload("auto") is None  # auto falls back to glibc's malloc
    with pytest.raises(AllocatorError, match=r"apt-get install libjemalloc2\) nor cached in .*`make models`"):
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


def manifest(library: Path) -> dict[str, str]:
    tree = library.parents[3]  # <cache>/libjemalloc2/usr/lib/<triplet>/libjemalloc.so.2
    return dict(line.split(" ", 1) for line in (tree / jemalloc.MANIFEST).read_text().splitlines())


@pytest.fixture(scope="module")
def fetched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(XDG_CACHE_HOME, library): a real fetch into an empty cache, the system's own libjemalloc hidden."""
    if shutil.which("apt-get") is None:
        pytest.skip("apt-get is not on PATH (not a Debian/Ubuntu host)")
    xdg = tmp_path_factory.mktemp("xdg")
    cache = xdg / "sr-gateway" / "jemalloc"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jemalloc, "find_library", lambda name: None)
        library = jemalloc.fetch(cache)
    assert library is not None, "apt-get download libjemalloc2 failed on a host with apt-get"
    yield xdg, library
    shutil.rmtree(xdg)


def test_a_fresh_host_gets_debians_jemalloc_checked_and_extracted_into_the_cache_and_it_preloads(
        fetched: tuple[Path, Path]) -> None:
    xdg, library = fetched
    assert library.is_relative_to(xdg / "sr-gateway" / "jemalloc" / "libjemalloc2" / "usr" / "lib")
    assert library.name == "libjemalloc.so.2" and not library.is_symlink()
    elf = library.read_bytes()
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[16:18], sys.byteorder) == 3  # ET_DYN: a shared library
    recorded = manifest(library)
    assert recorded["library_sha256"] == sha256_file(library)
    assert recorded["deb"].startswith("libjemalloc2_") and recorded["deb"].endswith(".deb")
    index = subprocess.run(["apt-cache", "show", "libjemalloc2"], capture_output=True, text=True, timeout=60)
    if "SHA256:" in index.stdout:  # the host's own lists (a fresh host's may be empty: the fetch reads its own)
        assert f"SHA256: {recorded['sha256']}" in index.stdout  # the very .deb apt's signed index lists
    child = subprocess.run(
        [sys.executable, "-c", "import pathlib; assert 'libjemalloc' in pathlib.Path('/proc/self/maps').read_text();"
                               " print('ok')"],
        env={"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(library)}, capture_output=True, text=True, timeout=60)
    assert (child.returncode, child.stdout, child.stderr) == (0, "ok\n", "")  # ld.so complains on stderr


def test_a_filled_cache_is_used_without_running_apt_get_again(
        fetched: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    xdg, library = fetched
    runs: list[list[str]] = []
    monkeypatch.setattr(jemalloc, "_run", lambda argv, cwd, timeout_s: runs.append(argv))
    monkeypatch.setattr(jemalloc, "find_library", lambda name: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    assert jemalloc.fetch() == library and jemalloc.fetch(xdg / "sr-gateway" / "jemalloc") == library
    assert runs == []


def test_auto_and_jemalloc_take_the_cached_copy_where_the_system_has_none(
        fetched: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    xdg, library = fetched
    monkeypatch.setattr(supervisor, "find_library", lambda name: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    assert triton_preload("auto") == triton_preload("jemalloc") == str(library)
    for module in (supervisor, jemalloc):
        monkeypatch.setattr(module, "find_library", lambda name: "libjemalloc.so.2")
    assert triton_preload("auto") == "libjemalloc.so.2"  # the system's own library comes first
    assert jemalloc.fetch(xdg / "elsewhere") is None and not (xdg / "elsewhere").exists()  # nothing to fetch


def test_a_failed_fetch_warns_that_triton_runs_on_glibc_and_never_fails_make_models(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(jemalloc, "find_library", lambda name: None)
    caplog.set_level(logging.WARNING, logger="sr_build.jemalloc")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no apt-get at all
    assert jemalloc.fetch(tmp_path / "cache") is None
    failing = tmp_path / "bin"  # an apt-get that finds no such package, as on a host without the Debian index
    failing.mkdir()
    (failing / "apt-get").write_text('#!/bin/sh\nfor a; do last=$a; done\n[ "$last" = update ] && exit 0\n'
                                     'echo "E: Unable to locate package $last" >&2\nexit 100\n')
    (failing / "dpkg-deb").write_text("#!/bin/sh\nexit 2\n")
    for tool in ("apt-get", "dpkg-deb"):
        (failing / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(failing))
    assert jemalloc.fetch(tmp_path / "cache") is None
    assert not any((tmp_path / "cache").iterdir())  # neither a tree nor a temporary directory is left
    first, second = (r.getMessage() for r in caplog.records)
    assert "apt-get is not on PATH" in first and "E: Unable to locate package libjemalloc2" in second
    for message in (first, second):
        assert "glibc's malloc, whose memory creeps" in message and "apt-get install libjemalloc2" in message
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jemalloc.main() == 0
    assert "not available; tritonserver runs on glibc's malloc" in capsys.readouterr().out
