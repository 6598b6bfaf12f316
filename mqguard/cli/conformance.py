"""``mqguard conformance``: generated scenarios on real Artemis and through mqguard, compared."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import click

from mqguard.cli.outfile import output_file
from mqguard.conformance.model import PATH_NAMES
from mqguard.servers import ServerHandle, ServerStartError, ServerUnavailable, start

if TYPE_CHECKING:
    from mqguard.conformance.paths import ConformancePath
    from mqguard.conformance.runner import ScenarioResult

__all__ = ["conformance"]


def _parse_paths(value: str) -> list[str]:
    names = [p.strip() for p in value.split(",") if p.strip()]
    unknown = [p for p in names if p not in PATH_NAMES]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown path(s) {', '.join(unknown) or '(none)'}; choose from "
            f"{', '.join(PATH_NAMES)}", param_hint="--paths")
    return [p for p in PATH_NAMES if p in names]


def _quiet_guard() -> None:
    # The scenarios make the guard reject duplicates and drop expired messages on purpose:
    # its warnings about them would bury the progress lines. `mqguard -v` shows them.
    log = logging.getLogger("mqguard")
    if log.getEffectiveLevel() >= logging.WARNING:
        log.setLevel(logging.ERROR)


@contextlib.contextmanager
def _servers(kinds: set[str]) -> Iterator[dict[str, ServerHandle]]:
    handles: dict[str, ServerHandle] = {}
    try:
        for kind in sorted(kinds):
            click.echo(f"starting {kind} ...", err=True)
            handles[kind] = start(kind)
        yield handles
    finally:
        for handle in handles.values():
            with contextlib.suppress(Exception):
                handle.stop()
            shutil.rmtree(handle.state_dir, ignore_errors=True)


def _paths(names: list[str], handles: dict[str, ServerHandle]) -> list[ConformancePath]:
    from mqguard.conformance.paths import (
        artemis_path,
        prepare_rabbitmq,
        sidecar_path,
        wrapper_path,
    )

    if "rabbitmq" in handles:
        prepare_rabbitmq(handles["rabbitmq"], handles["rabbitmq"].urls["stomp"])
    out = []
    for name in names:
        if name == "artemis":
            out.append(artemis_path(handles["artemis"]))
        else:
            front, kind = name.split("-", 1)
            url = handles[kind].urls["stomp"]
            out.append(sidecar_path(kind, url) if front == "sidecar" else wrapper_path(kind, url))
    return out


def _progress(total: int) -> Callable[[ScenarioResult], None]:
    seen: list[ScenarioResult] = []

    def report(result: ScenarioResult) -> None:
        seen.append(result)
        undocumented = len(result.undocumented)
        documented = len(result.differences) - undocumented
        status = "ok" if not result.differences else (
            f"{undocumented} undocumented, {documented} documented difference(s)")
        if not result.compared:
            status = "not compared (fewer than two paths ran it)"
        click.echo(f"[{len(seen)}/{total}] scenario {result.index}: {status}"
                   + (f" (reference {result.reference}; skipped: "
                      f"{', '.join(sorted(result.skipped))})" if result.skipped else ""),
                   err=True)
        for diff in result.undocumented:
            click.echo(f"    {diff.kind} {diff.path}: {diff.detail}", err=True)

    return report


@click.command()
@click.option("--examples", type=click.IntRange(1, 10_000), default=20, show_default=True,
              help="How many scenarios to generate and run.")
@click.option("--seed", "seed_value", type=int, default=0, show_default=True,
              help="Hypothesis seed: the same seed gives the same scenarios.")
@click.option("--paths", "paths_value", default=",".join(PATH_NAMES), show_default=True,
              help="Comma-separated paths; the first one that runs a scenario is the "
                   "reference (Artemis, unless the scenario uses bridge ids).")
@click.option("--json", "json_path", callback=output_file, metavar="FILE",
              help="Write every scenario, observation and difference to this file.")
def conformance(examples: int, seed_value: int, paths_value: str,
                json_path: str | None) -> None:
    """Run generated scenarios on real Artemis (over STOMP) and through mqguard (sidecar and
    wrappers, on ActiveMQ and RabbitMQ), and compare what an application observes.

    Starts the servers it needs locally (Artemis from Maven Central on first use). Exit
    status 1 when a difference is found that docs/artemis-compat.md does not list. The
    guard's warnings (duplicates rejected, messages expired: what the scenarios ask for)
    are shown with `mqguard -v conformance`.
    """
    names = _parse_paths(paths_value)
    _quiet_guard()
    try:
        from mqguard.conformance.generator import generate
        from mqguard.conformance.runner import run_scenarios
    except ImportError as exc:
        raise click.ClickException(
            f"mqguard conformance needs the test extras ({exc.name} is missing): "
            "pip install 'mqguard[test]'") from None
    kinds = {"artemis" if n == "artemis" else n.split("-", 1)[1] for n in names}
    scenarios = generate(examples, seed_value)
    click.echo(f"{len(scenarios)} scenario(s), seed {seed_value}, paths {', '.join(names)}",
               err=True)
    try:
        with _servers(kinds) as handles:
            results = run_scenarios(scenarios, _paths(names, handles),
                                    progress=_progress(len(scenarios)))
    except (ServerUnavailable, ServerStartError) as exc:
        raise click.ClickException(f"a server did not start: {exc}") from None
    kinds_found = Counter((d.kind, d.path, d.deviation) for r in results for d in r.differences)
    undocumented = sum(len(r.undocumented) for r in results)
    alone = sum(1 for r in results if not r.compared)
    click.echo(f"\n{len(results)} scenario(s); "
               f"{sum(1 for r in results if r.compared and not r.differences)} without "
               "differences" + (f"; {alone} not compared (fewer than two paths ran them)"
                                if alone else ""))
    for (kind, path, deviation), count in sorted(kinds_found.items(), key=str):
        label = f"documented: {deviation}" if deviation else "UNDOCUMENTED"
        click.echo(f"  {count:4d} x {kind} on {path} ({label})")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as fh:
            json.dump({"seed": seed_value, "paths": names,
                       "results": [r.to_json() for r in results]}, fh, indent=1)
    if undocumented:
        raise SystemExit(1)
