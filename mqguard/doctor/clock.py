"""Clock skew between this host and another server (Redis, the broker).

mqguard's expirations are wall-clock epoch milliseconds, compared by whichever process
looks at a message (producer, consumer, reaper, sidecar) and, with native expiry, by the
broker: a clock that is off by *s* ms makes messages expire *s* ms early or late, and
delays scheduled in Redis fire early or late by as much.

A skew is measured by one round trip: the host's clock is read before (``t0``) and after
(``t1``) a request that the other side answers with its own clock (``T``). If both clocks
agreed, ``T`` would lie between ``t0`` and ``t1``; the estimate is ``T - (t0 + t1) / 2``,
good to within half the round trip (``(t1 - t0) / 2``) plus the other side's clock
resolution. The verdict uses the smallest skew compatible with the measurement, so a slow
round trip never raises a false alarm.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqguard.doctor.model import Check, Status

__all__ = ["ERROR_MS", "WARNING_MS", "Skew", "skew_check"]

#: Above this (ms) a skew is reported as a warning: expirations and scheduled redeliveries
#: move by a noticeable fraction of a typical second-scale setting.
WARNING_MS = 250
#: Above this (ms) it is an error: messages expire whole seconds early or late.
ERROR_MS = 2000


@dataclass(frozen=True, slots=True)
class Skew:
    """The other side's clock minus this host's, as measured."""

    #: What was compared (``redis``, ``broker``).
    source: str
    #: How it was measured, for the report.
    method: str
    #: Estimated offset in ms (positive: the other clock is ahead).
    offset_ms: float
    #: Half the round trip plus the other clock's resolution, in ms.
    uncertainty_ms: float
    #: The clock compared with.
    reference: str = "this host"

    @classmethod
    def from_round_trip(cls, source: str, method: str, t0_ms: float, t1_ms: float,
                        remote_ms: float, resolution_ms: float = 0.0) -> Skew:
        return cls(source, method, remote_ms - (t0_ms + t1_ms) / 2,
                   (t1_ms - t0_ms) / 2 + resolution_ms)

    def relative_to(self, other: Skew) -> Skew:
        """This clock against ``other``'s, both measured from this host: the difference of
        the offsets, the sum of the uncertainties."""
        return Skew(self.source, f"difference of the {other.source} and {self.source} "
                    "measurements", self.offset_ms - other.offset_ms,
                    self.uncertainty_ms + other.uncertainty_ms, reference=other.source)

    @property
    def least_ms(self) -> float:
        """The smallest absolute skew the measurement allows."""
        return max(0.0, abs(self.offset_ms) - self.uncertainty_ms)


def skew_check(skew: Skew) -> Check:
    """ok / warning / error for ``skew`` (see :data:`WARNING_MS`, :data:`ERROR_MS`)."""
    least = skew.least_ms
    status = (Status.ERROR if least > ERROR_MS else
              Status.WARNING if least > WARNING_MS else Status.OK)
    ahead = "ahead of" if skew.offset_ms >= 0 else "behind"
    detail = (f"{skew.source} clock {abs(skew.offset_ms):.0f} ms {ahead} {skew.reference} "
              f"(+/- {skew.uncertainty_ms:.0f} ms; {skew.method})")
    fix = "" if status is Status.OK else (
        f"synchronise the clocks of {skew.reference} and {skew.source} (NTP/chrony): "
        "expirations are wall-clock epoch ms")
    name = (f"skew-{skew.source}" if skew.reference == "this host"
            else f"skew-{skew.source}-{skew.reference}")
    return Check("clock", name, status, detail, fix,
                 data={"offset_ms": round(skew.offset_ms, 1),
                       "uncertainty_ms": round(skew.uncertainty_ms, 1),
                       "method": skew.method})
