"""What can be checked of docker/*.Dockerfile without building them (a build needs buildah and minutes to an hour:
docker/build_local.sh): pinned bases, a non-root final USER, and COPY sources that exist and reach the build
context (not excluded by .dockerignore)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def ignored(relative: str) -> bool:
    """Whether .dockerignore keeps a path out of the build context (its patterns, as these files use them)."""
    for pattern in (ROOT / ".dockerignore").read_text().split():
        pattern = pattern.removeprefix("**/")
        if fnmatch.fnmatch(relative, pattern) or any(fnmatch.fnmatch(part, pattern)
                                                     for part in relative.split("/")):
            return True
    return False


def test_the_three_images_have_dockerfiles() -> None:
    assert [p.name for p in DOCKERFILES] == ["controlplane.Dockerfile", "gateway.Dockerfile", "triton.Dockerfile"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_base_is_pinned_to_a_version_tag_or_digest(path: Path) -> None:
    steps = instructions(path)
    args = dict(re.match(r"(\w+)=?(.*)", a).groups() for k, a in steps if k == "ARG")  # type: ignore[union-attr]
    stages = {a.split()[-1] for k, a in steps if k == "FROM" and " AS " in a.upper()}
    bases = [a.split()[0] for k, a in steps if k == "FROM"]
    assert bases
    for base in bases:
        name = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
        if name in stages:
            continue
        assert "@sha256:" in name or re.search(r":\d+(\.\d+)+[\w.-]*$", name), f"{path.name}: {name} is not pinned"
        assert not name.endswith(":latest")


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_the_final_stage_runs_as_a_numeric_non_root_user(path: Path) -> None:
    steps = instructions(path)
    last_from = max(i for i, (k, _) in enumerate(steps) if k == "FROM")
    users = [a for k, a in steps[last_from:] if k == "USER"]
    assert users, f"{path.name}: the final stage has no USER (it would run as root)"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or int(gid) != 0), users[-1]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_copy_source_exists_in_the_repository_and_the_build_context(path: Path) -> None:
    copies = [a for k, a in instructions(path) if k in ("COPY", "ADD") and not a.startswith("--from")]
    assert copies
    for args in copies:
        *sources, _ = [a for a in args.split() if not a.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), f"{path.name}: COPY {source}: not in the repository"
            assert not ignored(source), f"{path.name}: COPY {source}: excluded by .dockerignore"
