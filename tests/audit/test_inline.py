"""Small frames as inline SQL tables: the same rows as ``createDataFrame``, no task."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from mqguard.audit import inline
from mqguard.audit.inline import local_frame, sql_literal

pytestmark = pytest.mark.spark

SCHEMA = StructType([StructField("file", StringType()), StructField("limit", LongType()),
                     StructField("rank", IntegerType()), StructField("flag", BooleanType())])

AWKWARD = ["it's", "back\\slash", "\\'", "tab\tnew\nline", "é ü 漢字 🙂", "`tick`", "\\u0041",
           "", "a'b\\c'd", "--comment", "/* x */", "%s"]


def _rows() -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = [(text, i * 10**12, i, i % 2 == 0)
                                   for i, text in enumerate(AWKWARD)]
    rows.append((None, None, None, None))
    rows.append(("max", 2**63 - 1, 2**31 - 1, True))
    rows.append(("min", -(2**63), -(2**31), False))
    return rows


def _is_local_relation(frame: Any) -> bool:
    return "LocalRelation" in frame._jdf.queryExecution().optimizedPlan().toString()


def test_same_rows_and_types_as_create_data_frame(spark: Any) -> None:
    rows = _rows()
    frame = local_frame(spark, rows, SCHEMA)
    assert frame.schema.simpleString() == SCHEMA.simpleString()
    assert [tuple(r) for r in frame.collect()] == rows
    assert sorted(map(tuple, frame.collect()), key=repr) == sorted(
        map(tuple, spark.createDataFrame(rows, SCHEMA).collect()), key=repr)
    # Held by the driver: a join or a collect needs no Python worker.
    assert _is_local_relation(frame)


def test_empty_rows_keep_the_schema(spark: Any) -> None:
    frame = local_frame(spark, [], SCHEMA)
    assert frame.schema.simpleString() == SCHEMA.simpleString()
    assert frame.collect() == []
    assert _is_local_relation(frame)


def test_many_rows_go_the_python_way(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inline, "MAX_INLINE_ROWS", 2)
    rows = _rows()
    frame = local_frame(spark, rows, SCHEMA)
    assert sorted(map(tuple, frame.collect()), key=repr) == sorted(rows, key=repr)
    assert not _is_local_relation(frame)


@pytest.mark.parametrize(("value", "data_type"), [
    (True, LongType()), (1, BooleanType()), ("1", IntegerType()), (1.5, LongType()),
    (b"x", StringType()), (1, StringType()),
])
def test_a_value_of_another_type_is_an_error(value: Any, data_type: Any) -> None:
    with pytest.raises(TypeError, match="is not a"):
        sql_literal(value, data_type)


def test_unsupported_column_type_is_an_error() -> None:
    with pytest.raises(TypeError, match="unsupported column type double"):
        sql_literal(1.5, DoubleType())


def test_a_short_row_is_an_error(spark: Any) -> None:
    with pytest.raises(ValueError, match="has 2 values for 4 columns"):
        local_frame(spark, [("a", 1)], SCHEMA)
