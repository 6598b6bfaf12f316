"""deploy/docker: the sidecar image's Dockerfile, checked without a Docker engine."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from mqguard_tests.deploy import (
    DEPLOY,
    REPO,
    FakeStompBroker,
    assert_admin_on_loopback,
    hostport,
    load_toml_text,
    sidecar_options,
)

from mqguard.cli import main
from mqguard.config import parse_config
from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"


@pytest.fixture(scope="module")
def parsed() -> DockerfileParser:
    parser = DockerfileParser(fileobj=DOCKERFILE.open("rb"))
    assert parser.structure, "Dockerfile parsed to nothing"
    return parser


def _instructions(parser: DockerfileParser, name: str) -> list[str]:
    return [item["value"] for item in parser.structure if item["instruction"] == name]


def _final_stage(parser: DockerfileParser) -> list[dict[str, str]]:
    starts = [i for i, item in enumerate(parser.structure) if item["instruction"] == "FROM"]
    return parser.structure[starts[-1]:]


def test_base_is_slim_python_matching_the_project(parsed: DockerfileParser) -> None:
    args = dict(re.match(r"(\w+)=(\S+)", v).groups() for v in _instructions(parsed, "ARG")
                if "=" in v)
    image = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", image), image
    assert _instructions(parsed, "FROM")[-1] == "${PYTHON_IMAGE}"


def test_runs_as_a_non_root_user(parsed: DockerfileParser) -> None:
    users = [item["value"] for item in _final_stage(parsed) if item["instruction"] == "USER"]
    assert users, "the final stage sets no USER: the sidecar would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert int(user) == 10001  # the k8s manifest's runAsUser (test_k8s checks that side)


def test_entrypoint_and_cmd_are_a_real_sidecar_command_line(parsed: DockerfileParser) -> None:
    entrypoint = json.loads(_instructions(parsed, "ENTRYPOINT")[-1])
    assert entrypoint[0] == "mqguard"
    assert entrypoint[1] in main.commands and entrypoint[1] == "sidecar"
    cmd = json.loads(_instructions(parsed, "CMD")[-1])
    options = sidecar_options(entrypoint[2:] + cmd)  # raises on an unknown option
    assert hostport(options["listen"])[0] == "0.0.0.0"  # reachable from outside the container
    assert options["admin"], "no admin port: the HEALTHCHECK would have nothing to ask"
    assert options["config_path"] == "/etc/mqguard/mqguard.toml"
    # The unauthenticated admin port stays inside the container unless exposed deliberately.
    admin = assert_admin_on_loopback(options)
    exposed = {int(p) for v in _instructions(parsed, "EXPOSE") for p in v.split()}
    assert hostport(options["listen"])[1] in exposed and admin not in exposed


def test_usage_comment_does_not_publish_the_admin_port() -> None:
    usage = DOCKERFILE.read_text().split("ARG ", 1)[0]
    run = usage[usage.index("docker run"):usage.index("--log-format")]
    assert "9464:9464" not in run and "--admin 127.0.0.1:9464" in run
    # How to expose it deliberately is said, with a loopback-only publication.
    assert "-p 127.0.0.1:9464:9464" in usage and "docs/operations.md" in usage


def test_healthcheck_asks_the_admin_health_endpoint(parsed: DockerfileParser) -> None:
    health = _instructions(parsed, "HEALTHCHECK")[-1]
    url = re.search(r"http://127\.0\.0\.1:(\d+)/health", health)
    assert url, health
    cmd = json.loads(_instructions(parsed, "CMD")[-1])
    assert int(url.group(1)) == hostport(sidecar_options(cmd)["admin"])[1]


def test_copied_files_exist_and_pass_the_dockerignore(parsed: DockerfileParser) -> None:
    allowed = [line[1:].rstrip("/") for line in
               (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
               if line.startswith("!")]
    for value in _instructions(parsed, "COPY"):
        if value.startswith("--from"):
            continue
        *sources, _ = value.split()
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"
            assert source.rstrip("/") in allowed, f"COPY {source}: excluded by .dockerignore"


def test_baked_in_configuration_loads() -> None:
    config = load_toml_text((DEPLOY / "docker" / "mqguard.toml").read_text(),
                            "deploy/docker/mqguard.toml")
    assert config.core.store == "memory"
    assert not Path(config.core.event_log.directory).is_absolute()  # under WORKDIR


def _health_command(parsed: DockerfileParser, port: int) -> list[str]:
    health = _instructions(parsed, "HEALTHCHECK")[-1]
    exec_form = json.loads(health[health.index("CMD") + 3:].strip())
    assert exec_form[0] == "python"
    return [sys.executable, *(arg.replace(":9464/", f":{port}/") for arg in exec_form[1:])]


def test_healthcheck_command_follows_the_sidecars_health(parsed: DockerfileParser,
                                                         tmp_path: Path) -> None:
    # The HEALTHCHECK's own command, run against a real sidecar: 0 while the broker answers
    # a STOMP CONNECT, non-zero (503) once it does not (after the probe's 1 s cache).
    broker = FakeStompBroker()
    config = parse_config({"mqguard": {"message-expiry-scan-period": -1, "event-log": {
        "directory": str(tmp_path / "events")}}})
    upstream = parse_upstream(f"stomp://127.0.0.1:{broker.port}")
    proxy = Sidecar(config, upstream, admin=("127.0.0.1", 0))
    with SidecarThread(proxy) as running:
        command = _health_command(parsed, running.admin_port)
        healthy = subprocess.run(command, capture_output=True, timeout=30)
        assert healthy.returncode == 0, healthy.stderr
        broker.close()
        time.sleep(1.2)
        unhealthy = subprocess.run(command, capture_output=True, timeout=30)
        assert unhealthy.returncode != 0
        assert b"503" in unhealthy.stderr, unhealthy.stderr


def test_usage_comment_builds_from_the_repository_root() -> None:
    text = DOCKERFILE.read_text()
    build = next(line for line in text.splitlines() if "docker build" in line)
    words = shlex.split(build.lstrip("# "))
    assert words[words.index("-f") + 1] == "deploy/docker/Dockerfile" and words[-1] == "."


def _stages(parser: DockerfileParser) -> dict[str, list[dict[str, str]]]:
    """Each stage's instructions (FROM excluded), by its name (the last one: runtime)."""
    stages: dict[str, list[dict[str, str]]] = {}
    current: list[dict[str, str]] = []
    for item in parser.structure:
        if item["instruction"] == "FROM":
            words = item["value"].split()
            current = []
            stages[words[-1] if len(words) == 3 and words[1].upper() == "AS" else "runtime"] = (
                current)
        else:
            current.append(item)
    return stages


def test_native_stage_builds_the_crate_and_the_build_stage_uses_its_wheel(
        parsed: DockerfileParser) -> None:
    stages = _stages(parsed)
    copied = {source for item in stages["native"] if item["instruction"] == "COPY"
              for source in item["value"].split()[:-1]}
    # Everything maturin needs to build native/ (the files setup.sh hashes, too).
    assert {"native/Cargo.toml", "native/Cargo.lock", "native/pyproject.toml",
            "native/mqguard_native.pyi", "native/src"} <= copied
    runs = " ".join(item["value"] for item in stages["native"] if item["instruction"] == "RUN")
    assert "maturin build --release --locked" in runs and "--out /wheels" in runs
    build = stages["build"]
    assert any(item["instruction"] == "COPY" and item["value"] == "--from=native /wheels /wheels"
               for item in build)
    wheel = next(item["value"] for item in build if item["instruction"] == "RUN")
    assert "--find-links /wheels" in wheel and "--wheel-dir /wheels" in wheel
    # mqguard requires the very version the crate builds.
    version = re.search(r'^version = "([^"]+)"', (REPO / "native" / "Cargo.toml").read_text(),
                        re.M)
    assert version is not None
    assert f'"mqguard-native=={version.group(1)}"' in (REPO / "pyproject.toml").read_text()


def test_build_stage_files_make_a_working_install(parsed: DockerfileParser,
                                                  tmp_path: Path) -> None:
    # The image's build stage without Docker: copy exactly what its COPY lines copy, build
    # the wheel from that alone, install it into a fresh virtualenv (dependencies from this
    # environment), and run the entrypoint's command from there.
    # (mqguard-native, the native stage's wheel, is the one installed in this environment.)
    context = tmp_path / "src"
    context.mkdir()
    stages = _stages(parsed)
    assert list(stages) == ["native", "build", "runtime"], list(stages)
    for item in stages["build"]:
        if item["instruction"] != "COPY" or item["value"].startswith("--from"):
            continue
        *sources, dest = item["value"].split()
        target = context / dest.removeprefix("./")
        for source in sources:
            origin = REPO / source
            into = target / origin.name if len(sources) > 1 or dest.endswith("/") else target
            if origin.is_dir():
                shutil.copytree(origin, into,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, into)
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(wheels), str(context)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = wheels.glob("mqguard-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {"mqguard/plugins/duplicate_detection.py", "mqguard/adapters/stomp.py",
            "mqguard/cli/sidecar.py"} <= names
    assert not any(name.startswith(("plugins/", "adapters/", "tests/")) for name in names)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--disable-pip-version-check", str(wheel)], check=True, timeout=300)
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import mqguard.plugins, sys; "
         "print(mqguard.plugins.__file__)"], capture_output=True, text=True, check=True,
        cwd=tmp_path)
    assert where.stdout.startswith(str(venv)), where.stdout  # the wheel, not this checkout
    check = subprocess.run([str(venv / "bin" / "mqguard"), "config", "check",
                            str(DEPLOY / "docker" / "mqguard.toml")],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert "duplicate_detection" in check.stdout
    entrypoint = json.loads(_instructions(parsed, "ENTRYPOINT")[-1])
    help_text = subprocess.run([str(venv / "bin" / entrypoint[0]), *entrypoint[1:], "--help"],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert help_text.returncode == 0 and "--upstream" in help_text.stdout
