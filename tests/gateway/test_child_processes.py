"""Child processes of the threaded services (the gateway runs asyncio's to_thread pool and gRPC's threads, the
control plane its executor) start without `preexec_fn`: Python code between fork and exec can deadlock on a lock
another thread held at the fork. Death-with-parent comes from `setpriv --pdeathsig` instead (its effect is tested
for real in test_self_healing's killed-gateway test)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "controlplane", "sr_common", "sr_backend", "sr_build")


def preexec_calls(source: str) -> list[int]:
    """Line numbers of calls that pass `preexec_fn=` (to any function: subprocess, asyncio or a wrapper)."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and any(k.arg == "preexec_fn" for k in node.keywords)]


def test_the_check_finds_a_preexec_fn_wherever_it_is_passed() -> None:
    assert preexec_calls("import subprocess\nsubprocess.Popen(['x'], preexec_fn=lambda: None)\n") == [2]
    assert preexec_calls("await asyncio.create_subprocess_exec('x', preexec_fn=f)\n") == [1]
    assert preexec_calls("subprocess.Popen(['x'], start_new_session=True)\n") == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_service_module_starts_a_child_with_a_preexec_fn(package: str) -> None:
    found = {str(path.relative_to(ROOT)): lines for path in sorted((ROOT / package).rglob("*.py"))
             if (lines := preexec_calls(path.read_text(encoding="utf-8")))}
    assert found == {}


def test_tritonserver_is_started_under_setpriv_with_a_parent_death_signal() -> None:
    from gateway import supervisor

    prefix = supervisor._die_with_parent()
    assert Path(prefix[0]).name == "setpriv" and prefix[1:] == ["--pdeathsig", "TERM", "--"]
