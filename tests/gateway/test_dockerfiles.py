"""What can be checked of docker/*.Dockerfile without building them (a build needs buildah and minutes to an hour:
docker/build_local.sh): pinned bases, a non-root final USER, and COPY sources that exist and reach the build
context (not excluded by .dockerignore)."""

from __future__ import annotations

import fnmatch
import json
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


# -- supply chain: hash-pinned installs, no host pip configuration, an init as PID 1 -------------------------------

REQUIREMENTS = ROOT / "docker" / "requirements"


def pip_installs(path: Path) -> list[str]:
    """Each `pip install ...` command of the file's RUN steps (split at &&, ; and ||)."""
    runs = [a for k, a in instructions(path) if k == "RUN"]
    return [part.strip() for run in runs for part in re.split(r"&&|;|\|\|", run)
            if re.search(r"\bpip3? install\b", part)]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_pip_install_is_hash_pinned_or_the_repositorys_own_wheel_offline(path: Path) -> None:
    installs = pip_installs(path)
    assert installs
    for command in installs:
        if "--require-hashes" in command:
            files = re.findall(r"-r\s+\"?([^\s\"]+)", command)
            assert files, command
            for file in files:
                name = Path(file.replace("${ORT}", "onnxruntime")).name
                assert (REQUIREMENTS / name).is_file(), f"{path.name}: {name} is not in docker/requirements"
        else:  # only this repository's wheel, built in the same build, with no index to fetch anything else from
            assert "--no-index" in command and "--no-deps" in command and "/wheels/" in command, command


@pytest.mark.parametrize("lock", sorted(REQUIREMENTS.glob("*.txt")), ids=lambda p: p.name)
def test_every_locked_requirement_is_one_version_with_its_hashes(lock: Path) -> None:
    text = lock.read_text().replace("\\\n", " ")
    entries = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert entries
    for entry in entries:
        assert re.match(r"^[A-Za-z0-9._-]+(\[[\w, -]+\])?==\S+", entry), entry  # extras kept: `a[b, c]==1`
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), entry
    assert "://" not in lock.read_text(), f"{lock.name} names an index (a host) it should not"


def test_the_locks_satisfy_pyprojects_requirements() -> None:
    """A dependency added to pyproject.toml without rerunning docker/lock.sh fails here, not in an image build."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    def pins(name: str) -> dict[str, str]:
        text = (REQUIREMENTS / name).read_text()
        return {canonicalize_name(m.group(1)): m.group(2)
                for m in re.finditer(r"^([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==([^\s\\]+)", text, re.M)}

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {"gateway.txt": project["dependencies"],
              "controlplane.txt": project["dependencies"] + project["optional-dependencies"]["controlplane"],
              "gateway-build.txt": project["dependencies"] + project["optional-dependencies"]["export"]}
    for lock, requirements in wanted.items():
        locked = pins(lock)
        for text in requirements:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            assert name in locked, f"{lock}: {req.name} is not locked (run docker/lock.sh)"
            assert req.specifier.contains(locked[name], prereleases=True), f"{lock}: {req} but {locked[name]}"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_no_image_gets_a_pip_configuration_copied_in(path: Path) -> None:
    for keyword, args in instructions(path):
        if keyword in ("COPY", "ADD"):
            assert not re.search(r"pip\.conf|pip\.ini|\.pip\b|/pip/", args), f"{path.name}: {keyword} {args}"
        if keyword in ("ENV", "ARG"):
            assert not re.search(r"PIP_CONFIG_FILE|PIP_INDEX_URL|PIP_CERT", args), f"{path.name}: {keyword} {args}"
        if keyword == "RUN":  # a private index reaches pip as a build secret, mounted for the step only
            assert "pip.conf" not in args or "--mount=type=secret,id=pip.conf" in args, args


def test_the_local_build_passes_the_hosts_pip_configuration_as_a_secret_not_a_file_in_the_image() -> None:
    script = (ROOT / "docker" / "build_local.sh").read_text()
    code = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
    for line in code:
        if "pip.conf" in line or "pip/pip.conf" in line:
            assert not re.search(r"\b(cp|install|ln|tee|mv|rsync)\b", line) and ">" not in line.split("pip.conf")[0], \
                line
    assert any("--secret" in line and "pip.conf" in line for line in code)


def test_the_gateway_image_runs_an_init_as_pid_1() -> None:
    steps = instructions(ROOT / "docker" / "gateway.Dockerfile")
    entrypoint = [a for k, a in steps if k == "ENTRYPOINT"][-1]
    argv = json.loads(entrypoint)
    assert argv[0] in ("dumb-init", "tini", "/usr/bin/tini", "/usr/bin/dumb-init") and argv[-1] == "sr-gateway", argv
    assert re.search(r"^dumb-init==", (REQUIREMENTS / "gateway.txt").read_text(), re.M)


def test_the_gateway_image_tunes_only_an_engine_its_serving_images_install() -> None:
    """The build stage has torch (for the export); a tuned config naming it fails every load in the final image and
    in sr-triton, which install ONNX Runtime only (found by building the image, 2026-12-06)."""
    runs = [a for k, a in instructions(ROOT / "docker" / "gateway.Dockerfile") if k == "RUN"]
    (build,) = [part for run in runs for part in re.split(r"&&|;", run) if "models build" in part]
    engine = re.search(r"--engine[ =](\S+)", build)
    assert engine, f"the image build tunes across whatever engines its build stage has: {build.strip()}"
    package = engine.group(1)  # each engine's name is its package's (onnxruntime, openvino, torch)
    for lock in ("gateway.txt", "triton-onnxruntime.txt"):
        assert re.search(rf"^{package}==", (REQUIREMENTS / lock).read_text(), re.M), f"{lock} lacks {package}"
