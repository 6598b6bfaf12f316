"""deploy/spark: the spark-submit wrapper of `mqguard audit`."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from mqguard_tests.deploy import DEPLOY

from mqguard.cli.audit import audit
from mqguard.config import parse_config
from mqguard.consumer import GuardedConsumer
from mqguard.pipeline import Guard
from mqguard.producer import GuardedProducer
from mqguard.testing.loopback import LoopbackAdapter

SCRIPT = DEPLOY / "spark" / "submit-audit.sh"
ENTRY = DEPLOY / "spark" / "mqguard_audit_main.py"


def _audit_option_names() -> set[str]:
    return {name for param in audit.params for name in (*param.opts, *param.secondary_opts)}


def test_script_parses_with_bash_n() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert os.access(SCRIPT, os.X_OK)


def test_options_given_to_the_audit_exist() -> None:
    text = SCRIPT.read_text()
    call = text[text.index('"$here/mqguard_audit_main.py"'):]
    passed = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", call))
    assert passed, call
    assert passed <= _audit_option_names(), passed - _audit_option_names()


@pytest.fixture
def fake_submit(tmp_path: Path) -> Path:
    """A stand-in spark-submit that records its argv as JSON."""
    record = tmp_path / "argv.json"
    stub = tmp_path / "spark-submit"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"json.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n")
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return stub


def _run(args: list[str], stub: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("SPARK_MASTER", "MQGUARD_VENV_ARCHIVE", "MQGUARD_AUDIT_OUT",
                                "SPARK_SUBMIT_ARGS")}
    environment.update(SPARK_SUBMIT=str(stub), **env)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=environment, timeout=60)


def test_command_line_handed_to_spark_submit(fake_submit: Path) -> None:
    result = _run(["-m", "yarn", "-a", "venv.tar.gz", "-o", "/shared/audit",
                   "hdfs:///logs/mqguard", "--", "-c", "mqguard.toml", "--json"],
                  fake_submit, SPARK_SUBMIT_ARGS="--executor-memory 4g")
    assert result.returncode == 0, result.stderr
    argv = json.loads((fake_submit.parent / "argv.json").read_text())
    entry = argv.index(str(ENTRY))
    submit, audit_args = argv[:entry], argv[entry + 1:]
    assert submit[submit.index("--master") + 1] == "yarn"
    assert submit[submit.index("--deploy-mode") + 1] == "client"
    assert submit[submit.index("--archives") + 1] == "venv.tar.gz#environment"
    assert "spark.pyspark.python=./environment/bin/python" in submit
    assert submit[-2:] == ["--executor-memory", "4g"]
    # What the entry point receives is a valid `mqguard audit` command line.
    context = audit.make_context("audit", list(audit_args))
    assert context.params["master"] == "yarn"
    assert context.params["out"] == "/shared/audit"
    assert context.params["inputs"] == ("hdfs:///logs/mqguard",)
    assert context.params["config_path"] == "mqguard.toml" and context.params["as_json"]


@pytest.mark.parametrize(("args", "message"), [
    ([], "at least one INPUT"),
    (["-d", "sideways", "logs"], "client or cluster"),
    (["-x", "logs"], "unknown option -x"),
])
def test_bad_arguments_exit_2(fake_submit: Path, args: list[str], message: str) -> None:
    result = _run(args, fake_submit)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (fake_submit.parent / "argv.json").exists()


def _event_log(directory: Path, lost: int) -> None:
    """A real event log: 20 messages sent and handled, ``lost`` more sent and never seen."""
    config = parse_config({"mqguard": {"event-log": {"directory": str(directory)}}})
    with Guard(config) as guard:
        adapter = LoopbackAdapter()
        producer = GuardedProducer(adapter, guard=guard)
        for index in range(20):
            producer.send("orders", b"%d" % index)
        with GuardedConsumer(adapter, "orders", lambda message: None, guard):
            adapter.pump()
        for index in range(lost):
            producer.send("orders", b"lost %d" % index)
        adapter.loop.drain("orders")  # gone at the broker: the audit must call them lost


@pytest.mark.spark
def test_runs_the_audit_through_a_real_spark_submit(tmp_path: Path) -> None:
    spark_submit = shutil.which("spark-submit")
    if spark_submit is None:
        message = "spark-submit not found: pip install -e '.[spark]' provides it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    events = tmp_path / "events"
    _event_log(events, lost=2)
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", str(SCRIPT), "-m", "local[1]", "-o", str(out), str(events), "--",
         "--assume-drained", "--grace-ms", "0", "--json"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "SPARK_SUBMIT": spark_submit, "SPARK_LOCAL_IP": "127.0.0.1",
             "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
             "SPARK_SUBMIT_ARGS": "--driver-memory 1g --conf spark.ui.enabled=false"})
    assert result.returncode == 1, result.stderr[-3000:]  # the audit's "anomalies found"
    summary = json.loads(result.stdout)
    assert summary["messages"] == 22
    assert summary["classes"]["lost"]["count"] == 2
    assert (out / "summary.json").is_file()


def test_script_passes_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        # deploy/local/install.sh installs it: under CI a missing tool is a failure, not a skip.
        message = "shellcheck not installed (deploy/local/install.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
