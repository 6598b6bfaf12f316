"""Install the server binaries from Debian packages when they are missing.

Only Debian packages are used because this is what a locked-down CI runner or dev box can reach
(no Docker engine, no image registry, only the package mirrors).  Installing needs root; when
that is impossible the caller gets a :class:`ServerUnavailable` whose message says why, which the
pytest plugin turns into a skip (locally) or a failure (in CI).

ActiveMQ needs one extra step: Debian's ``activemq`` package ships the MQTT transport but not
the MQTT codec it depends on, so the connector dies with ``NoClassDefFoundError:
org/fusesource/mqtt/codec/...``.  The codec jars are taken from ``libmqtt-client-java`` and
``libhawtdispatch-java`` *without installing them* (``apt-get download`` + ``dpkg-deb -x``) into
a per-user cache, so this works without root once the packages are downloadable.

Artemis has no Debian package: Maven (the ``maven`` package) fetches its binary distribution
from Maven Central once into the same cache (:mod:`mqguard.servers.artemis_dist`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from mqguard.servers.filelock import file_lock
from mqguard.servers.handle import ServerUnavailable

__all__ = [
    "ACTIVEMQ_HOME",
    "KINDS",
    "RABBITMQ_BIN",
    "cache_dir",
    "ensure_installed",
    "missing_binaries",
    "mqtt_codec_jars",
]

KINDS: tuple[str, ...] = (
    "redis", "redis-cluster", "activemq", "rabbitmq", "rabbitmq-cluster", "mosquitto",
    "artemis",
)

ACTIVEMQ_HOME = Path("/usr/share/activemq")
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")

_PACKAGES: dict[str, tuple[str, ...]] = {
    "redis": ("redis-server", "redis-tools"),
    "redis-cluster": ("redis-server", "redis-tools"),
    "activemq": ("activemq",),
    "rabbitmq": ("rabbitmq-server",),
    "rabbitmq-cluster": ("rabbitmq-server",),
    "mosquitto": ("mosquitto",),
    # Debian has no Artemis: Maven fetches it (mqguard.servers.artemis_dist), and the
    # "maven" package is installed when that is needed.
    "artemis": ("default-jre-headless",),
}

# What must exist for a launcher to work: commands on PATH or absolute paths.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "redis": ("redis-server", "redis-cli"),
    "redis-cluster": ("redis-server", "redis-cli"),
    "activemq": ("java", str(ACTIVEMQ_HOME / "bin" / "activemq.jar")),
    "rabbitmq": (
        str(RABBITMQ_BIN / "rabbitmq-server"),
        str(RABBITMQ_BIN / "rabbitmqctl"),
        str(RABBITMQ_BIN / "rabbitmq-plugins"),
        "epmd",
    ),
    "mosquitto": ("mosquitto",),
    "artemis": ("java",),
}
_REQUIRED["rabbitmq-cluster"] = _REQUIRED["rabbitmq"]

# name inside the .deb -> package that ships it
_CODEC_JARS: dict[str, str] = {
    "mqtt-client.jar": "libmqtt-client-java",
    "hawtdispatch.jar": "libhawtdispatch-java",
    "hawtdispatch-transport.jar": "libhawtdispatch-java",
}

_APT_TIMEOUT = 1800.0
_lock = threading.Lock()
_apt_updated = False


def _found(requirement: str) -> bool:
    if requirement.startswith("/"):
        return Path(requirement).exists()
    # Debian puts mosquitto and epmd outside a normal user's PATH (/usr/sbin, /usr/lib/erlang);
    # the launchers use the same lookup, so check exactly what they will run.
    return find_binary(requirement) is not None


def find_binary(name: str) -> str | None:
    """Locate ``name`` on PATH or in the sbin directories a non-root PATH usually lacks."""
    extra = os.pathsep.join(["/usr/sbin", "/sbin", "/usr/local/sbin"])
    return shutil.which(name) or shutil.which(name, path=extra)


def missing_binaries(kind: str) -> list[str]:
    """The executables/files ``kind`` needs that are not present."""
    if kind not in _REQUIRED:
        raise ValueError(f"unknown server kind {kind!r}; expected one of {', '.join(KINDS)}")
    return [req for req in _REQUIRED[kind] if not _found(req)]


def cache_dir() -> Path:
    """Per-user cache (``$XDG_CACHE_HOME/mqguard`` or ``~/.cache/mqguard``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mqguard"


def _apt_env() -> dict[str, str]:
    env = dict(os.environ)
    env["DEBIAN_FRONTEND"] = "noninteractive"
    return env


def _run_apt(args: list[str], what: str, cwd: Path | None = None) -> None:
    # DPkg::Lock::Timeout makes concurrent installers (another pytest worker, a provisioning
    # script still running) queue on the dpkg lock instead of failing immediately.
    cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=600", *args]
    try:
        result = subprocess.run(
            cmd,
            env=_apt_env(),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=_APT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerUnavailable(f"{what}: {' '.join(cmd)} failed: {exc}") from exc
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise ServerUnavailable(f"{what}: {' '.join(cmd)} exited with {result.returncode}\n{tail}")


def _apt_update() -> None:
    global _apt_updated
    if not _apt_updated:
        _run_apt(["update", "-q"], "apt-get update")
        _apt_updated = True


@contextlib.contextmanager
def _no_service_autostart() -> Iterator[None]:
    """Keep package post-install scripts from starting system-wide daemons.

    Without a policy-rc.d, installing redis-server/rabbitmq-server/mosquitto on a machine
    without systemd starts them from /etc/init.d on their default ports, as their own users,
    outside our control.  A temporary policy-rc.d that answers 101 ("action forbidden") is the
    Debian-sanctioned way to prevent that; an existing one is left untouched.
    """
    policy = Path("/usr/sbin/policy-rc.d")
    if policy.exists():
        yield
        return
    try:
        policy.write_text("#!/bin/sh\n# written by mqguard.servers.install\nexit 101\n")
        policy.chmod(0o755)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            policy.unlink()


def _install_packages(packages: list[str]) -> None:
    if os.geteuid() != 0:
        raise ServerUnavailable(
            f"packages {', '.join(packages)} are not installed and this process is not root, "
            f"so they cannot be installed; run: sudo apt-get install -y {' '.join(packages)}"
        )
    if shutil.which("apt-get") is None:
        raise ServerUnavailable(f"packages {', '.join(packages)} missing and no apt-get here")
    _apt_update()
    with _no_service_autostart():
        _run_apt(
            ["install", "-y", "-q", *packages],
            f"installing {', '.join(packages)}",
        )


def ensure_installed(kinds: Iterable[str] = KINDS) -> None:
    """Make sure the servers in ``kinds`` can be started; install what is missing.

    Raises :class:`ServerUnavailable` with the reason when that is impossible.
    """
    wanted = list(dict.fromkeys(kinds))
    with _lock:
        packages: list[str] = []
        for kind in wanted:
            if missing_binaries(kind):
                packages.extend(p for p in _PACKAGES[kind] if p not in packages)
        if packages:
            _install_packages(packages)
        for kind in wanted:
            still = missing_binaries(kind)
            if still:
                raise ServerUnavailable(
                    f"{kind}: still missing after installing {', '.join(_PACKAGES[kind])}: "
                    f"{', '.join(still)}"
                )
        if "activemq" in wanted:
            mqtt_codec_jars()
        if "artemis" in wanted:
            from mqguard.servers.artemis_dist import artemis_cached, artemis_home

            if not artemis_cached() and find_binary("mvn") is None:
                _install_packages(["maven"])
            artemis_home()


def mqtt_codec_jars() -> list[Path]:
    """Paths of the MQTT codec jars ActiveMQ's MQTT connector needs, fetching them if needed.

    Installed system copies (``/usr/share/java``) are preferred; otherwise the .debs are
    downloaded and unpacked into ``<cache>/activemq-mqtt-jars``.  A file lock serialises
    concurrent fetches from parallel test workers.
    """
    system = [Path("/usr/share/java") / name for name in _CODEC_JARS]
    if all(p.is_file() for p in system):
        return system
    target = cache_dir() / "activemq-mqtt-jars"
    jars = [target / name for name in _CODEC_JARS]
    if all(p.is_file() for p in jars):
        return jars
    with file_lock(cache_dir() / "activemq-mqtt-jars.lock"):
        if all(p.is_file() for p in jars):
            return jars
        _fetch_codec_jars(target)
    missing = [p.name for p in jars if not p.is_file()]
    if missing:
        raise ServerUnavailable(f"MQTT codec jars not found in the packages: {missing}")
    return jars


def _fetch_codec_jars(target: Path) -> None:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise ServerUnavailable("ActiveMQ MQTT codec jars missing and no apt-get/dpkg-deb here")
    packages = sorted(set(_CODEC_JARS.values()))
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mqguard-jars-") as tmp:
        work = Path(tmp)
        # Sandbox::User=root: the _apt user cannot write into a private temp dir, and apt only
        # warns about it; saying so explicitly keeps the output clean.
        download = ["-o", "APT::Sandbox::User=root", "download", *packages]
        try:
            _run_apt(download, "downloading the MQTT codec for ActiveMQ", cwd=work)
        except ServerUnavailable:
            # A fresh machine has no package lists yet ("Unable to locate package").
            if os.geteuid() != 0:
                raise
            _apt_update()
            _run_apt(download, "downloading the MQTT codec for ActiveMQ", cwd=work)
        unpacked = work / "x"
        for deb in work.glob("*.deb"):
            subprocess.run(
                ["dpkg-deb", "-x", str(deb), str(unpacked)], check=True, capture_output=True
            )
        for name in _CODEC_JARS:
            found = unpacked / "usr" / "share" / "java" / name
            if found.is_file():
                # Copy through a temp name so a concurrent reader never sees half a jar.
                tmp_copy = target / f".{name}.part"
                shutil.copyfile(found.resolve(), tmp_copy)
                tmp_copy.replace(target / name)
