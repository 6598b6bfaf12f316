"""Small DataFrames made from driver-side rows without a Python worker.

PySpark's ``createDataFrame(list, schema)`` ships the rows as a Python RDD
(``parallelize``): the first job that reads them starts Python worker processes to
unpickle a few rows. In an audit that was the first job of the session: 2 tasks of
over 2 s wall each for a few hundredths of a second of CPU (the workers' start), before
the main pass could begin.

:func:`local_frame` writes the rows as SQL instead (``SELECT CAST(col1 AS ...) FROM
VALUES ...``): Spark turns an inline table into a ``LocalRelation``, which the driver
holds and joins by broadcast without any task. Above :data:`MAX_INLINE_ROWS` rows the
SQL text takes longer to parse than a worker takes to start, so those go the Python way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructType,
)

#: Rows above which :func:`local_frame` uses ``createDataFrame``. Measured with rank rows
#: (three columns): an inline table of 5,000 rows took 1.5 s to parse and count, 20,000
#: rows 3.4 s; a Python worker's first start about 1.6 s, then 0.4 s per small job.
MAX_INLINE_ROWS = 5000


def sql_string(value: str) -> str:
    """``value`` as a Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_literal(value: Any, data_type: DataType) -> str:
    """``value`` as a SQL literal of ``data_type`` (string, long, int or boolean).

    Raises :class:`TypeError` for a value of another Python type, as ``createDataFrame``
    would: a silent ``str()`` could hide a bug in the caller.
    """
    if value is None:
        return "NULL"
    # bool is an int in Python: a flag must not pass as a number, nor a number as a flag.
    if isinstance(data_type, StringType) and isinstance(value, str):
        return sql_string(value)
    if isinstance(data_type, BooleanType) and isinstance(value, bool):
        return "true" if value else "false"
    if (isinstance(data_type, LongType | IntegerType) and isinstance(value, int)
            and not isinstance(value, bool)):
        return str(value)
    if not isinstance(data_type, StringType | BooleanType | LongType | IntegerType):
        raise TypeError(f"local_frame: unsupported column type {data_type.simpleString()}")
    raise TypeError(f"local_frame: {value!r} is not a {data_type.simpleString()}")


def local_frame(spark: SparkSession, rows: Sequence[Sequence[Any]],
                schema: StructType) -> DataFrame:
    """``rows`` (tuples in ``schema``'s column order) as a DataFrame that needs no task.

    Column types: string, long, int, boolean (what the audit's small tables hold).
    """
    if len(rows) > MAX_INLINE_ROWS:
        return spark.createDataFrame(list(rows), schema)
    fields = schema.fields
    columns = ", ".join(
        f"CAST({'NULL' if not rows else f'col{i}'} AS {f.dataType.simpleString()}) "
        f"AS `{f.name.replace('`', '``')}`" for i, f in enumerate(fields, 1))
    if not rows:
        # An empty inline table is not valid SQL; a filtered-out row optimises to an
        # empty LocalRelation all the same.
        return spark.sql(f"SELECT {columns} WHERE false")
    values = []
    for row in rows:
        if len(row) != len(fields):
            raise ValueError(f"local_frame: row {tuple(row)!r} has {len(row)} values for "
                             f"{len(fields)} columns")
        values.append("(" + ", ".join(sql_literal(v, f.dataType)
                                      for v, f in zip(row, fields, strict=True)) + ")")
    return spark.sql(f"SELECT {columns} FROM VALUES {', '.join(values)}")
