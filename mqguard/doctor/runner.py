"""Running every doctor check in order: configuration, broker, Redis store, clocks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mqguard.config import MqguardConfig
from mqguard.doctor.broker_mqtt import check_mqtt_broker
from mqguard.doctor.broker_stomp import check_stomp_broker
from mqguard.doctor.clock import Skew, skew_check
from mqguard.doctor.config import check_config, ring_budget
from mqguard.doctor.model import Check, Report, Status
from mqguard.doctor.redis_store import check_redis
from mqguard.redact import redact_text, redact_url, redact_urls_in

__all__ = ["DoctorOptions", "run_doctor"]

_STOMP = ("stomp", "stomp+ssl")
_MQTT = ("mqtt", "mqtts")


@dataclass(frozen=True, slots=True)
class DoctorOptions:
    """What ``mqguard doctor`` was asked to check."""

    #: Broker URL; default: the local node of the first broker group in the configuration.
    url: str | None = None
    #: Store URL; default: ``[mqguard] store`` of the configuration.
    store: str | None = None
    #: ``mqguard.toml``; default ``./mqguard.toml`` if present, else the defaults.
    config_path: str | None = None
    #: The broker's own configuration file (``activemq.xml``, ``mosquitto.conf``).
    broker_config: str | None = None
    #: RabbitMQ management API URL; default ``http://<broker host>:15672``.
    management_url: str | None = None
    #: A ``rabbitmqctl`` command line for RabbitMQ's queues and policies (instead of the
    #: management API), e.g. ``"rabbitmqctl -n rabbit@host"``.
    rabbitmqctl: str | None = None
    #: Addresses to budget duplicate-ID rings for, beyond those the configuration names.
    addresses: int | None = None


def _guarded(area: str, url: str, run: Callable[[], tuple[list[Check], Skew | None]]
             ) -> tuple[list[Check], Skew | None]:
    """``run``, with any unexpected failure reported as an error check (never a traceback,
    never a credential)."""
    try:
        return run()
    except Exception as exc:  # a diagnostic tool reports; it does not crash
        text = redact_urls_in(redact_text(f"{type(exc).__name__}: {exc}", url))
        return [Check(area, "unexpected-failure", Status.ERROR,
                      f"{area} checks failed: {text}",
                      fix="an unexpected failure of the check itself: report it with this "
                          "message")], None


def _broker(options: DoctorOptions, url: str | None, cfg: MqguardConfig | None
            ) -> tuple[list[Check], Skew | None]:
    if url is None:
        return [Check("broker", "reachable", Status.SKIPPED, "no broker URL given",
                      fix="pass --url stomp://host:61613 (or mqtt://...)")], None
    scheme = url.partition("://")[0].lower()
    if scheme in _STOMP:
        return check_stomp_broker(url, cfg, broker_config=options.broker_config,
                                  management_url=options.management_url,
                                  rabbitmqctl=options.rabbitmqctl)
    if scheme in _MQTT:
        return check_mqtt_broker(url, broker_config=options.broker_config), None
    return [Check("broker", "reachable", Status.ERROR,
                  f"{redact_url(url)}: unsupported scheme {scheme or '(none)'}",
                  fix="use stomp://, stomp+ssl://, mqtt:// or mqtts://")], None


def run_doctor(options: DoctorOptions, progress: Callable[[str], None] | None = None
               ) -> Report:
    """Every check; ``progress`` is told which area starts (for a spinner)."""
    say = progress or (lambda _step: None)
    report = Report()
    say("configuration")
    checks, config = check_config(options.config_path)
    report.add(checks)

    url = options.url
    if url is None and config is not None and config.core.groups:
        url = next(iter(config.core.groups.values())).local_node()
    say("broker")
    broker_checks, broker_skew = _guarded(
        "broker", url or "", lambda: _broker(options, url, config))
    report.add(broker_checks)

    store = options.store or (config.core.store if config is not None else None)
    say("redis")
    redis_skew: Skew | None = None
    if store is None:
        report.add(Check("redis", "reachable", Status.SKIPPED,
                         "no store: the configuration is invalid and --store was not given",
                         fix="fix the configuration or pass --store redis://..."))
    elif store == "memory":
        report.add(Check("redis", "reachable", Status.SKIPPED,
                         "store is memory (one process, nothing shared to check)",
                         fix="pass --store redis://... or set [mqguard] store to check Redis"))
    else:
        budget = ring_budget(config, options.addresses) if config is not None else None
        store_url = store
        redis_checks, redis_skew = _guarded("redis", store,
                                            lambda: check_redis(store_url, budget))
        report.add(redis_checks)

    say("clocks")
    for source, skew in (("redis", redis_skew), ("broker", broker_skew)):
        if skew is not None:
            report.add(skew_check(skew))
        elif not any(c.area == "clock" and c.name == f"skew-{source}" for c in report.checks):
            report.add(Check("clock", f"skew-{source}", Status.SKIPPED,
                             f"not measured: {source} not checked or shows no clock"))
    if broker_skew is not None and redis_skew is not None:
        # The broker's native expiry and mqguard's Redis-held schedules compare with each
        # other too, not only with this host.
        report.add(skew_check(broker_skew.relative_to(redis_skew)))
    return report
