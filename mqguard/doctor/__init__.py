"""``mqguard doctor``: checks what mqguard's guarantees rely on (docs/doctor.md).

One module per area: :mod:`~mqguard.doctor.config`, the brokers
(:mod:`~mqguard.doctor.broker_stomp` with :mod:`~mqguard.doctor.broker_activemq` and
:mod:`~mqguard.doctor.broker_rabbitmq`, :mod:`~mqguard.doctor.broker_mqtt`),
:mod:`~mqguard.doctor.redis_store` and :mod:`~mqguard.doctor.clock`; each returns
:class:`~mqguard.doctor.model.Check` objects, ok / warning / error with the fix.
"""

from __future__ import annotations

from mqguard.doctor.model import SCHEMA_VERSION, Check, Report, Status
from mqguard.doctor.runner import DoctorOptions, run_doctor

__all__ = ["SCHEMA_VERSION", "Check", "DoctorOptions", "Report", "Status", "run_doctor"]
