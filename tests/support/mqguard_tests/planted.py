"""A synthetic cluster with one planted example of every anomaly the audit reports."""

from __future__ import annotations

from collections import defaultdict

from mqguard.config import parse_config
from mqguard_tests.synthetic import T0, Cluster

CONFIG = parse_config({"address-settings": {
    "orders": {"max-delivery-attempts": 3, "dead-letter-address": "DLA",
               "expiry-address": "EXP"},
}})


def plant(cluster: Cluster) -> tuple[int, dict[str, set[str]]]:
    """Write a run with every class planted; returns (watermark, expected ids per class)."""
    c = cluster
    expected: dict[str, set[str]] = defaultdict(set)

    # -- lost: accepted, never terminal, while later messages on "orders" were handled.
    c.send("lost-never-delivered")
    crashed = c.send("lost-delivered-then-nothing")
    c.delivered(crashed)  # the consumer died; the broker never redelivered it
    expected["lost"] |= {"lost-never-delivered", "lost-delivered-then-nothing"}

    # -- fine: the ordinary paths.
    for n in range(5):
        c.handled(c.send(f"ok-{n}"))
    retried = c.send("ok-retried")
    c.failed(retried, count=1)
    c.failed(retried, count=2)
    c.handled(retried, count=3)
    crash = c.send("ok-crash-redelivered")
    c.delivered(crash, count=1)  # crash: no outcome, redelivered elsewhere
    c.handled(crash, node="consumer-2", count=2)
    dup = c.send("ok-duplicate-suppressed")
    c.handled(dup)
    c.suppressed(dup)
    fanout = c.send("ok-two-subscriptions", "prices")
    c.handled(fanout, queue="prices.sub-a")
    c.handled(fanout, node="consumer-2", queue="prices.sub-b")
    poison = c.send("ok-poison")
    c.failed(poison, count=1)
    c.failed(poison, count=2)
    copy = c.dead_lettered(poison, count=3)
    c.handled(copy, node="dla-consumer")  # the DLA copy consumed: not "unexpected"
    tx = [c.message("ok-tx-1"), c.message("ok-tx-2")]
    c.commit("tx-1", tx)
    for message in tx:
        c.handled(message)
    c.roll_back("tx-2", 2)  # its messages were never sent: no events, nothing to judge
    c.duplicate_rejected("ok-duplicate-rejected")  # never sent, never delivered
    c.expired(c.send("ok-expired-moved", expiration=T0 + 50))
    c.expired(c.send("ok-expired-dropped", "prices", expiration=T0 + 50), target=None)
    on_time = c.send("ok-expiring-on-time", expiration=c.clock.now_ms + 10_000)
    c.handled(on_time)

    # -- informational classes.
    recovered = c.send_failed("recovered-1")
    c.handled(recovered)
    expected["recovered"].add("recovered-1")
    c.send_failed("indeterminate-1")
    expected["indeterminate"].add("indeterminate-1")
    stranger = c.message("unguarded:0f0f")
    c.handled(stranger)
    expected["unguarded"].add("unguarded:0f0f")

    # -- anomalies.
    c.handled(c.message("unexpected-never-sent"))
    c.handled(c.duplicate_rejected("unexpected-rejected-but-delivered"))
    expected["unexpected"] |= {"unexpected-never-sent", "unexpected-rejected-but-delivered"}

    twice = c.send("duplicated-twice-handled")
    c.handled(twice)
    c.handled(twice, node="consumer-2")
    again = c.send("duplicated-delivered-after-success")
    c.handled(again)
    c.failed(again, count=2)
    logged = c.send("duplicated-audit-logged")
    c.handled(logged)
    c.logged_duplicate(logged)
    expected["duplicated"] |= {"duplicated-twice-handled", "duplicated-delivered-after-success",
                               "duplicated-audit-logged"}

    over = c.send("over-delivered")
    for count in (1, 2, 3):
        c.failed(over, count=count)
    c.handled(over, count=4)  # max-delivery-attempts of "orders" is 3
    expected["over_delivered"].add("over-delivered")

    early = c.send("early-dead-letter")
    c.dead_lettered(early, count=1)
    expected["early_dead_letter"].add("early-dead-letter")

    c.dead_lettered(c.send("dead-letter-not-moved"), moved=False)
    expected["dead_letter_not_moved"].add("dead-letter-not-moved")

    c.expired(c.send("expiry-not-moved", expiration=T0 + 50), moved=False)
    expected["expiry_not_moved"].add("expiry-not-moved")

    late = c.send("late-delivery", expiration=c.clock.now_ms + 10)
    c.clock.advance(5_000)
    c.handled(late)
    expected["late_delivery"].add("late-delivery")

    # -- unseen: in flight at the watermark.
    pending = c.send("unseen-redelivery-pending")
    c.failed(pending, delay_ms=3_600_000)
    c.send("unseen-last-on-its-address", "audit.tail")
    expected["unseen"] |= {"unseen-redelivery-pending", "unseen-last-on-its-address"}
    c.handled(c.send("ok-last"))  # the consumers got past everything above

    busy = c.send("unseen-handled-after-watermark")
    watermark = c.clock.advance(1_000)
    c.clock.advance(1_000)
    c.delivered(busy)
    expected["unseen"].add("unseen-handled-after-watermark")
    c.send("after-watermark-not-judged")  # no fate, but sent after the watermark
    c.close()
    return watermark, expected
