"""Pure pieces of the RabbitMQ cluster support: the STOMP adapter's ``failover`` option, the
fixture module's names and docs, and reading ``rabbitmqctl eval`` output."""

from __future__ import annotations

from pathlib import Path

import pytest

import mqguard.testing.rabbitmq_cluster as fixtures
from mqguard.adapters.stomp import StompAdapter
from mqguard.errors import AdapterError
from mqguard.servers.handle import ServerHandle
from mqguard.servers.rabbitmq_cluster import CLUSTER_KIND, RabbitMQCluster, running_from_eval

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_failover_urls_are_named_in_where_without_credentials() -> None:
    adapter = StompAdapter("stomp://guest:secret@127.0.0.1:61613",
                           failover=["stomp://127.0.0.1:61614", "stomp://u:p@127.0.0.1:61615"])
    assert adapter.where == ("STOMP broker at 127.0.0.1:61613 "
                             "(failover 127.0.0.1:61614, 127.0.0.1:61615)")
    assert "secret" not in adapter.where and "u:p" not in adapter.where


def test_failover_refuses_another_scheme_and_a_bare_string() -> None:
    with pytest.raises(AdapterError, match="main URL's scheme"):
        StompAdapter("stomp://127.0.0.1:61613", failover=["stomp+ssl://127.0.0.1:61614"])
    with pytest.raises(AdapterError, match="list of URLs"):
        StompAdapter("stomp://127.0.0.1:61613", failover="stomp://127.0.0.1:61614")


def test_no_failover_keeps_the_old_description() -> None:
    assert StompAdapter("stomp://127.0.0.1:61613").where == "STOMP broker at 127.0.0.1:61613"


@pytest.mark.parametrize("name", fixtures.__all__)
def test_fixtures_are_prefixed_and_documented(name: str) -> None:
    assert name.startswith("mqguard_")
    assert f"`{name}`" in (DOCS / "writing-plugins.md").read_text(encoding="utf-8")


def test_running_nodes_are_read_from_an_erlang_list() -> None:
    assert running_from_eval("['a-1@localhost','a-2@localhost',\n 'a-3@localhost']\n") == {
        "a-1@localhost", "a-2@localhost", "a-3@localhost"}
    assert running_from_eval("[]\n") == set()


def test_a_cluster_view_needs_a_cluster_handle(tmp_path: Path) -> None:
    single = ServerHandle(kind="rabbitmq", urls={}, pid=0, state_dir=tmp_path,
                          log_path=tmp_path / "x.log", version="")
    with pytest.raises(ValueError, match=CLUSTER_KIND):
        RabbitMQCluster(single)
