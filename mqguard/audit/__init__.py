"""``mqguard audit``: Spark jobs that judge what the event log says happened.

The question every operator of a guarded broker asks is whether anything got
lost, delivered twice, delivered too often or delivered late. The event log
(:mod:`mqguard.events`) records every send outcome and every delivery outcome,
so the answer can be computed from it alone, after the fact and at any scale:
``local[*]`` on a laptop, any Spark master when the logs outgrow one machine.

One module per job:

- :mod:`~mqguard.audit.session`: the SparkSession (local defaults for a small machine);
- :mod:`~mqguard.audit.events`: finding the files and reading them with an explicit schema;
- :mod:`~mqguard.audit.limits`: per-address limits from ``mqguard.toml``;
- :mod:`~mqguard.audit.checks`: the anomaly classes and the one-pass plan that finds them;
- :mod:`~mqguard.audit.summary`: the JSON summary, the Parquet tables and the terminal table;
- :mod:`~mqguard.audit.runner`: the whole audit, as the CLI and the tests run it.

This package imports nothing from PySpark at import time (pyspark is the
``spark`` extra); the modules above do.
"""

from __future__ import annotations
