"""The ``mqguard`` command line. Each subcommand lives in its own module."""

from __future__ import annotations

import logging
import signal
import sys

import click

from mqguard import __version__
from mqguard.cli.audit import audit
from mqguard.cli.bench import bench
from mqguard.cli.config_cmd import config
from mqguard.cli.conformance import conformance
from mqguard.cli.dedup import dedup
from mqguard.cli.demo import demo
from mqguard.cli.dlq import dlq
from mqguard.cli.docs import docs
from mqguard.cli.doctor import doctor
from mqguard.cli.reap import reap
from mqguard.cli.redistribute import redistribute
from mqguard.cli.sidecar import sidecar


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="mqguard")
@click.option("-v", "--verbose", count=True, help="More log output (-v INFO, -vv DEBUG).")
def main(verbose: int) -> None:
    """mqguard: Artemis-grade delivery guarantees for existing STOMP and MQTT brokers.

    Duplicate-ID rejection, delivery counting with dead-letter routing, message
    expiry and redistribution, as plugins around your existing broker.
    """
    # SIGTERM must unwind like Ctrl-C, so that the local servers a command started
    # (demo, bench) are stopped by its `finally` blocks instead of being orphaned.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


main.add_command(demo)
main.add_command(audit)
main.add_command(bench)
main.add_command(config)
main.add_command(conformance)
main.add_command(dedup)
main.add_command(dlq)
main.add_command(docs)
main.add_command(doctor)
main.add_command(reap)
main.add_command(redistribute)
main.add_command(sidecar)
