"""Pure logic of ``mqguard doctor``: exit codes, skew verdicts, ring budgets and reading the
brokers' configuration files (the checks against real servers are in
tests/integration/test_doctor.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqguard.config import parse_config
from mqguard.doctor import Check, Report, Status
from mqguard.doctor.activemq_xml import read_activemq_xml
from mqguard.doctor.broker_mqtt import mosquitto_persistence
from mqguard.doctor.clock import ERROR_MS, WARNING_MS, Skew, skew_check
from mqguard.doctor.config import BYTES_PER_ID, ring_budget


def _check(status: Status) -> Check:
    return Check("redis", "x", status, "detail")


@pytest.mark.parametrize(("statuses", "code"), [
    ([], 0),
    ([Status.OK, Status.SKIPPED], 0),
    ([Status.OK, Status.WARNING, Status.SKIPPED], 1),
    ([Status.WARNING, Status.ERROR, Status.OK], 2),
])
def test_exit_code_is_the_worst_status(statuses: list[Status], code: int) -> None:
    report = Report()
    report.add(_check(s) for s in statuses)
    assert report.exit_code == code
    assert report.to_json()["exit_code"] == code
    assert sum(report.counts().values()) == len(statuses)


def test_skew_verdict_uses_the_smallest_skew_the_round_trip_allows() -> None:
    # 300 ms off, but the round trip leaves 100 ms of doubt: 200 ms at least, under the bar.
    assert skew_check(Skew("redis", "m", 300.0, 100.0)).status is Status.OK
    assert skew_check(Skew("redis", "m", -(WARNING_MS + 10), 5.0)).status is Status.WARNING
    late = skew_check(Skew("broker", "m", ERROR_MS + 500, 1.0))
    assert late.status is Status.ERROR and "ahead of" in late.detail and late.fix
    skew = Skew.from_round_trip("redis", "m", t0_ms=1000.0, t1_ms=1010.0, remote_ms=1105.0)
    assert skew.offset_ms == 100.0 and skew.uncertainty_ms == 5.0
    # Each within the bar of this host, but 400 ms apart: a warning between the two.
    pair = Skew("broker", "m", 200.0, 10.0).relative_to(Skew("redis", "m", -200.0, 10.0))
    check = skew_check(pair)
    assert (check.name, check.status) == ("skew-broker-redis", Status.WARNING)
    assert pair.uncertainty_ms == 20.0 and "ahead of redis" in check.detail


def test_ring_budget_counts_named_addresses_wildcards_and_extra_ones() -> None:
    config = parse_config({
        "mqguard": {"id-cache-size": 1000,
                    "groups": {"g": {"nodes": ["stomp://h:1"], "queues": ["jobs"]}}},
        "address-settings": {"#": {"max-delivery-attempts": 3},
                             "orders.#": {"id-cache-size": 5000},
                             "audit": {"id-cache-size": 0}},
    })
    budget = ring_budget(config)
    # orders.# (5000), audit (0), jobs (the global 1000); "#" is the defaults.
    assert (budget.addresses, budget.ids) == (3, 6000)
    assert budget.bytes == 6000 * BYTES_PER_ID
    assert ring_budget(config, addresses=10).ids == 6000 + 7 * 1000
    assert ring_budget(parse_config({})).ids == 20000  # one address at the default


def test_activemq_xml_facts(tmp_path: Path) -> None:
    xml = tmp_path / "activemq.xml"
    xml.write_text("""<beans xmlns="http://www.springframework.org/schema/beans">
      <broker xmlns="http://activemq.apache.org/schema/core" schedulerSupport="true">
        <destinationPolicy><policyMap><policyEntries>
          <policyEntry topic=">" maxPageSize="5"/>
          <policyEntry queue=">" maxPageSize="100000" persistJMSRedelivered="true"/>
        </policyEntries></policyMap></destinationPolicy>
      </broker></beans>""")
    facts = read_activemq_xml(xml)
    assert facts.scheduler_support and facts.persist_jms_redelivered
    assert facts.max_page_size == 100000
    xml.write_text('<beans><broker xmlns="http://activemq.apache.org/schema/core"/></beans>')
    facts = read_activemq_xml(xml)
    assert (facts.scheduler_support, facts.persist_jms_redelivered, facts.max_page_size) == (
        False, False, 200)
    xml.write_text("<beans/>")
    with pytest.raises(ValueError, match="no <broker>"):
        read_activemq_xml(xml)


def test_mosquitto_persistence_last_setting_wins(tmp_path: Path) -> None:
    conf = tmp_path / "mosquitto.conf"
    conf.write_text("persistence true\n# persistence false\npersistence false  # off\n")
    assert mosquitto_persistence(conf) is False
    conf.write_text("listener 1883\npersistence true\n")
    assert mosquitto_persistence(conf) is True
    with pytest.raises(ValueError, match="cannot read"):
        mosquitto_persistence(tmp_path / "missing.conf")


def test_every_option_of_the_command_is_in_the_synopsis() -> None:
    from mqguard.cli.doctor import doctor

    page = (Path(__file__).resolve().parents[2] / "docs" / "doctor.md").read_text()
    synopsis = page.split("```", 2)[1]
    params = [p for p in doctor.params if p.opts]
    assert len(params) == 8
    for param in params:
        # Each option as "[-x VALUE" or "[--long]", with the value named as in --help.
        value = "" if getattr(param, "is_flag", False) else f" {param.metavar}"
        assert any(f"[{opt}{value}]" in synopsis for opt in param.opts), param.opts
