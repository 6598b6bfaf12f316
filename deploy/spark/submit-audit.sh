#!/usr/bin/env bash
# Run `mqguard audit` on a Spark cluster through spark-submit.
#
# Usage:
#   deploy/spark/submit-audit.sh [-m MASTER] [-d client|cluster] [-a VENV.tar.gz] [-o OUT]
#                                INPUT... [-- AUDIT-OPTION...]
#
#   -m MASTER   Spark master (default $SPARK_MASTER, else spark://spark-master:7077);
#               also given to the audit as --master so the session joins that cluster.
#   -d MODE     spark-submit --deploy-mode (default client: the driver runs here, and
#               the summary and exit status come back to this shell).
#   -a ARCHIVE  A packed virtualenv with mqguard[spark] installed (venv-pack), shipped to
#               the executors as ./environment: the audit's Redis and broker-log checks run
#               Python on the executors. Default $MQGUARD_VENV_ARCHIVE; none: the executors'
#               own python3 must have mqguard installed.
#   -o OUT      The audit's --out directory (default $MQGUARD_AUDIT_OUT, else
#               ./mqguard-audit). On a cluster it must be a path that the driver and every
#               executor see at the same place (a shared mount): findings are written by the
#               executors and listed by the driver.
#   INPUT       Event-log directories, files or globs, or URLs Spark reads (hdfs://, s3a://).
#   AUDIT-OPTION  Any further `mqguard audit` option (e.g. -c mqguard.toml --json).
#
# Extra spark-submit options: $SPARK_SUBMIT_ARGS (split on spaces), e.g.
#   SPARK_SUBMIT_ARGS="--executor-memory 4g --num-executors 8".
# The spark-submit program: $SPARK_SUBMIT (default: spark-submit on PATH).
#
# Exit status: the audit's (0 no anomaly, 1 anomalies, 2 usage error, 3 could not run).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
master="${SPARK_MASTER:-spark://spark-master:7077}"
deploy_mode="client"
archive="${MQGUARD_VENV_ARCHIVE:-}"
out="${MQGUARD_AUDIT_OUT:-mqguard-audit}"

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while getopts ":m:d:a:o:h" opt; do
  case "$opt" in
    m) master="$OPTARG" ;;
    d) deploy_mode="$OPTARG" ;;
    a) archive="$OPTARG" ;;
    o) out="$OPTARG" ;;
    h) usage 0 ;;
    :) echo "submit-audit.sh: -$OPTARG needs a value" >&2; exit 2 ;;
    *) echo "submit-audit.sh: unknown option -$OPTARG" >&2; usage 2 >&2 ;;
  esac
done
shift $((OPTIND - 1))

inputs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do inputs+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
if [ ${#inputs[@]} -eq 0 ]; then
  echo "submit-audit.sh: give at least one INPUT (event-log directory, file, glob or URL)" >&2
  exit 2
fi
case "$deploy_mode" in
  client|cluster) ;;
  *) echo "submit-audit.sh: -d must be client or cluster, not '$deploy_mode'" >&2; exit 2 ;;
esac

# shellcheck disable=SC2206  # SPARK_SUBMIT may be a command with arguments
submit=(${SPARK_SUBMIT:-spark-submit} --master "$master" --deploy-mode "$deploy_mode"
        --name mqguard-audit
        --conf spark.sql.session.timeZone=UTC)
if [ -n "$archive" ]; then
  # Executors (and, in cluster mode, the driver) run the packed environment's Python.
  submit+=(--archives "$archive#environment"
           --conf spark.pyspark.python=./environment/bin/python)
  if [ "$deploy_mode" = "client" ]; then
    # The driver runs here: this machine's python, which must have mqguard installed.
    submit+=(--conf "spark.pyspark.driver.python=${PYSPARK_DRIVER_PYTHON:-python3}")
  fi
fi
# shellcheck disable=SC2206  # word splitting of SPARK_SUBMIT_ARGS is the point
extra=(${SPARK_SUBMIT_ARGS:-})

exec "${submit[@]}" "${extra[@]}" "$here/mqguard_audit_main.py" \
  --master "$master" --out "$out" "${inputs[@]}" "$@"
