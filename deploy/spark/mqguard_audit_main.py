"""spark-submit entry point for ``mqguard audit`` (see deploy/spark/README.md).

spark-submit runs a Python file, not a console script: this file hands its
arguments to the ``mqguard audit`` command unchanged, so every option of
``mqguard audit --help`` works here, and the exit status is the audit's
(0 clean, 1 anomalies, 2 usage error, 3 the audit could not run).
"""

from __future__ import annotations

import sys

from mqguard.cli import main

if __name__ == "__main__":
    main(["audit", *sys.argv[1:]], prog_name="mqguard")
