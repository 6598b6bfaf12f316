"""The Apache ActiveMQ Artemis binary distribution, fetched once with Maven and cached.

Debian has no Artemis package, but Maven Central serves the distribution as the artifact
``org.apache.activemq:apache-artemis:<version>:zip:bin`` (about 47 MB). ``mvn dependency:copy``
fetches it (through the user's ``~/.m2`` and its mirrors, so a machine with a repository
manager needs nothing else), and it is unpacked into ``<cache>/artemis/apache-artemis-<version>``
(see :func:`mqguard.servers.install.cache_dir`). Later calls find it there and touch neither
Maven nor the network. ``MQGUARD_ARTEMIS_HOME`` names an existing installation to use instead.

:func:`journal_buffer_timeout` is what ``artemis create`` would tune the journal to on this
machine, measured once and cached beside the distribution.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from mqguard.servers.filelock import file_lock
from mqguard.servers.handle import ServerUnavailable
from mqguard.servers.install import cache_dir, find_binary

__all__ = [
    "ARTEMIS_ARTIFACT",
    "ARTEMIS_VERSION",
    "artemis_cached",
    "artemis_home",
    "journal_buffer_timeout",
]

ARTEMIS_VERSION = "2.40.0"
ARTEMIS_ARTIFACT = f"org.apache.activemq:apache-artemis:{ARTEMIS_VERSION}:zip:bin"

_MAVEN_TIMEOUT = 1800.0


def _cli(home: Path) -> Path:
    return home / "bin" / "artemis"


def _cached_home() -> Path:
    given = os.environ.get("MQGUARD_ARTEMIS_HOME")
    if given:
        return Path(given)
    return cache_dir() / "artemis" / f"apache-artemis-{ARTEMIS_VERSION}"


def artemis_cached() -> bool:
    """True when :func:`artemis_home` needs neither Maven nor the network."""
    return _cli(_cached_home()).is_file()


def artemis_home() -> Path:
    """The Artemis installation (``ARTEMIS_HOME``), fetched with Maven on first use.

    Raises :class:`ServerUnavailable` when it is neither cached nor fetchable.
    """
    given = os.environ.get("MQGUARD_ARTEMIS_HOME")
    if given:
        home = Path(given)
        if not _cli(home).is_file():
            raise ServerUnavailable(f"MQGUARD_ARTEMIS_HOME={given}: no bin/artemis there")
        return home
    root = cache_dir() / "artemis"
    home = root / f"apache-artemis-{ARTEMIS_VERSION}"
    if _cli(home).is_file():
        return home
    with file_lock(root / ".lock"):
        # Another process (a parallel test worker) may have finished while we waited.
        if not _cli(home).is_file():
            _fetch(root, home)
    return home


def _fetch(root: Path, home: Path) -> None:
    mvn = find_binary("mvn")
    if mvn is None:
        raise ServerUnavailable("Artemis is not cached and Maven (mvn) is not installed: "
                                "apt-get install -y maven")
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
        work = Path(tmp)
        cmd = [mvn, "-B", "-q", "dependency:copy", f"-Dartifact={ARTEMIS_ARTIFACT}",
               f"-DoutputDirectory={work}"]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                    timeout=_MAVEN_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServerUnavailable(f"fetching Artemis with Maven failed: {exc}") from exc
        archive = work / f"apache-artemis-{ARTEMIS_VERSION}-bin.zip"
        if result.returncode != 0 or not archive.is_file():
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
            raise ServerUnavailable(
                f"fetching {ARTEMIS_ARTIFACT} with Maven failed (exit {result.returncode}):\n"
                f"{tail}")
        unpacked = work / "unpacked"
        _unzip(archive, unpacked)
        found = unpacked / home.name
        if not _cli(found).is_file():
            raise ServerUnavailable(f"{archive.name} holds no {home.name}/bin/artemis")
        if home.exists():  # a half-unpacked leftover of a killed fetch
            shutil.rmtree(home)
        # One rename: a concurrent reader sees either no installation or a complete one.
        found.rename(home)


def _unzip(archive: Path, target: Path) -> None:
    # zipfile drops Unix permissions; the scripts in bin/ must stay executable.
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            path = Path(zf.extract(info, target))
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                path.chmod(mode)


_TUNED = re.compile(r"<journal-buffer-timeout>(\d+)</journal-buffer-timeout>")
_TUNE_TIMEOUT = 300.0


def journal_buffer_timeout(home: Path, env: dict[str, str]) -> str:
    """The ``journal-buffer-timeout`` (ns) ``artemis create`` tunes to on this machine.

    ``artemis create`` measures how fast the disk syncs and sets the journal's write
    batching to match (its "auto tuning", ~7 s); every instance here is created without it,
    for speed, and gets the value measured once, in the system temp dir (where instances
    live), and cached in ``<cache>/artemis``. Without it Artemis would batch with its
    built-in default instead of what a user's installation gets.
    """
    cached = cache_dir() / "artemis" / f"journal-buffer-timeout-{ARTEMIS_VERSION}"
    with contextlib.suppress(OSError):
        return _checked(cached.read_text().strip())
    with file_lock(cached.parent / ".lock"):
        with contextlib.suppress(OSError):
            return _checked(cached.read_text().strip())
        with tempfile.TemporaryDirectory(prefix="mqguard-artemis-tune-") as tmp:
            instance = Path(tmp) / "instance"
            cmd = [str(_cli(home)), "create", str(instance), "--user", "tune", "--password",
                   "tune", "--allow-anonymous", "--no-web", "--silent", "--nio",
                   "--data", str(Path(tmp) / "data")]
            try:
                result = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                        check=False, timeout=_TUNE_TIMEOUT)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ServerUnavailable(f"tuning the Artemis journal failed: {exc}") from exc
            broker_xml = instance / "etc" / "broker.xml"
            found = _TUNED.search(broker_xml.read_text()) if broker_xml.is_file() else None
            if result.returncode != 0 or found is None:
                tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
                raise ServerUnavailable(f"tuning the Artemis journal failed "
                                        f"(exit {result.returncode}):\n{tail}")
        cached.write_text(found.group(1) + "\n")
        return found.group(1)


def _checked(value: str) -> str:
    if not value.isdigit():
        raise OSError(f"not a number of nanoseconds: {value!r}")
    return value
