"""The checkers of the fault runs, on histories written by hand: each catches what it must catch, and
takes an operation of unknown outcome as Jepsen does (it may have happened, even late), never as a
failure. No engine, no root: these run everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import TransportError
from reptables.engine.errors import ErrorCode, LockConflict, YtError
from reptables.testing.chaos.checkers import (
    OWN_KEYS,
    check_bank,
    check_history,
    check_register,
    check_set,
    check_stream,
    check_xdcr,
)
from reptables.testing.chaos.history import History, OpType, classify


def op(h: History, process: str, f: str, value: Any, outcome: OpType, result: Any = None) -> None:
    invoked = h.invoke(process, f, value)
    h.complete(invoked, outcome, result)


def final(h: History, **value: Any) -> None:
    h.record("final", "final-read", value)


# -- outcomes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("exc, outcome", [
    (TransportError("http://x", ConnectionRefusedError()), OpType.FAIL),
    (TransportError("http://x", TimeoutError("timed out")), OpType.UNKNOWN),
    (TransportError("http://x", ConnectionResetError()), OpType.UNKNOWN),
    (LockConflict("Row lock conflict", code=ErrorCode.TRANSACTION_LOCK_CONFLICT), OpType.FAIL),
    (YtError("Table //t has no synchronous replicas", code=ErrorCode.NO_SYNC_REPLICAS), OpType.FAIL),
    (YtError("Cannot write to sync replica 1-2-3-4 (r1://t): timed out", code=ErrorCode.UNAVAILABLE,
             attributes={"replica_id": "1-2-3-4"}), OpType.FAIL),
    (YtError("Command 'insert_rows' failed with an internal error", code=ErrorCode.GENERIC), OpType.UNKNOWN),
    (YtError("Service unavailable", code=ErrorCode.UNAVAILABLE), OpType.UNKNOWN),
])
def test_an_error_counts_as_a_failure_only_when_it_proves_nothing_was_applied(exc: Exception,
                                                                               outcome: OpType) -> None:
    assert classify(exc) is outcome


# -- set ---------------------------------------------------------------------------------------


def test_set_an_acknowledged_insert_missing_on_a_replica_is_lost() -> None:
    h = History()
    op(h, "set-0", "add", 1, OpType.OK)
    op(h, "set-0", "add", 2, OpType.OK)
    final(h, workload="set", cluster="r1", keys=[1, 2])
    final(h, workload="set", cluster="r2", keys=[1])
    result = check_set(h)
    assert result.lost == ["r2:2"] and not result.valid


def test_set_a_row_applied_twice_is_duplicated() -> None:
    h = History()
    op(h, "set-0", "add", 1, OpType.OK)
    final(h, workload="set", cluster="r1", keys=[1, 1])
    assert check_set(h).duplicated == ["r1:1 x2"]


def test_set_an_unknown_insert_may_be_present_or_absent() -> None:
    h = History()
    op(h, "set-0", "add", 1, OpType.UNKNOWN)
    op(h, "set-1", "add", 2, OpType.UNKNOWN)
    final(h, workload="set", cluster="r1", keys=[1])
    result = check_set(h)
    assert result.valid and result.stats["r1"]["unknown_present"] == 1


def test_set_a_failed_insert_that_shows_up_is_an_anomaly() -> None:
    h = History()
    op(h, "set-0", "add", 1, OpType.FAIL)
    final(h, workload="set", cluster="r1", keys=[1])
    assert "present although its insert failed" in check_set(h).anomalies[0]


def test_set_a_row_nobody_inserted_is_an_anomaly() -> None:
    h = History()
    op(h, "set-0", "add", 1, OpType.OK)
    final(h, workload="set", cluster="r1", keys=[1, 7])
    assert check_set(h).anomalies == ["r1: key 7 present but never inserted"]


def test_set_without_a_final_read_proves_nothing() -> None:
    h = History()
    op(h, "set-0", "add", 1, OpType.OK)
    assert not check_set(h).valid


# -- register ----------------------------------------------------------------------------------


def test_register_a_read_missing_a_write_acknowledged_before_it_began_is_stale() -> None:
    h = History()
    op(h, "reg-0", "write", {"k": 1, "v": 10}, OpType.OK)
    op(h, "reg-0", "write", {"k": 1, "v": 11}, OpType.OK)
    op(h, "reg-2", "read", {"k": 1}, OpType.OK, {"k": 1, "v": 10})
    final(h, workload="reg", cluster="r1", rows={"1": 11})
    result = check_register(h, "reg")
    assert result.stats["stale_reads"] == 1 and "read 10, but 11 was acknowledged" in result.anomalies[0]


def test_register_a_session_that_reads_an_older_value_after_a_newer_one_goes_back_in_time() -> None:
    h = History()
    write10 = h.invoke("reg-0", "write", {"k": 1, "v": 10})
    write11 = h.invoke("reg-1", "write", {"k": 1, "v": 11})  # concurrent: either order is fine...
    h.complete(write10, OpType.OK)
    h.complete(write11, OpType.OK)
    op(h, "reg-2", "read", {"k": 1}, OpType.OK, {"k": 1, "v": 11})
    op(h, "reg-2", "read", {"k": 1}, OpType.OK, {"k": 1, "v": 10})  # ...but not both in one session
    final(h, workload="reg", cluster="r1", rows={"1": 10})
    assert check_register(h, "reg").valid  # 10 and 11 were concurrent: 10 may be the later one
    h2 = History()
    op(h2, "reg-0", "write", {"k": 1, "v": 10}, OpType.OK)
    op(h2, "reg-0", "write", {"k": 1, "v": 11}, OpType.UNKNOWN)  # may land late...
    op(h2, "reg-2", "read", {"k": 1}, OpType.OK, {"k": 1, "v": 11})
    op(h2, "reg-2", "read", {"k": 1}, OpType.OK, {"k": 1, "v": 10})  # ...but 10 was acknowledged before 11 began
    final(h2, workload="reg", cluster="r1", rows={"1": 11})
    assert any("went back in time" in a for a in check_register(h2, "reg").anomalies)


def test_register_an_unknown_write_that_lands_late_may_end_as_the_value() -> None:
    h = History()
    op(h, "reg-0", "write", {"k": 1, "v": 10}, OpType.UNKNOWN)
    op(h, "reg-1", "write", {"k": 1, "v": 11}, OpType.OK)
    final(h, workload="reg", cluster="r1", rows={"1": 10})
    assert check_register(h, "reg").valid


def test_register_an_end_value_older_than_an_acknowledged_write_loses_it() -> None:
    h = History()
    op(h, "reg-0", "write", {"k": 1, "v": 10}, OpType.OK)
    op(h, "reg-0", "write", {"k": 1, "v": 11}, OpType.OK)
    final(h, workload="reg", cluster="r1", rows={"1": 11})
    final(h, workload="reg", cluster="r2", rows={"1": 10})
    result = check_register(h, "reg")
    assert result.lost == ["r2:1=11 (ends at 10)"]
    assert any("replicas disagree on key 1" in a for a in result.anomalies)


def test_register_an_end_value_whose_write_failed_is_an_anomaly() -> None:
    h = History()
    op(h, "reg-0", "write", {"k": 1, "v": 10}, OpType.OK)
    op(h, "reg-0", "write", {"k": 1, "v": 11}, OpType.FAIL)
    final(h, workload="reg", cluster="r1", rows={"1": 11})
    result = check_register(h, "reg")
    assert "whose write failed" in result.anomalies[0] and not result.valid


def test_register_a_value_nobody_wrote_is_an_anomaly() -> None:
    h = History()
    op(h, "reg-2", "read", {"k": 1}, OpType.OK, {"k": 1, "v": 99})
    final(h, workload="reg", cluster="r1", rows={})
    assert "which no write of that key wrote" in check_register(h, "reg").anomalies[0]


# -- bank --------------------------------------------------------------------------------------


def test_bank_a_snapshot_whose_total_differs_is_an_anomaly() -> None:
    h = History()
    h.info("bank", "setup", {"accounts": 2, "total": 200})
    op(h, "bank-1", "transfer", {"from": 0, "to": 1, "amount": 5}, OpType.OK)
    op(h, "bank-0", "read", {"source": "meta"}, OpType.OK, {"source": "meta", "balances": {"0": 95, "1": 105}})
    op(h, "bank-0", "read", {"source": "r2"}, OpType.OK, {"source": "r2", "balances": {"0": 95, "1": 100}})
    final(h, workload="bank", cluster="r1", balances={"0": 95, "1": 105})
    result = check_bank(h)
    assert result.anomaly_count == 1 and "read #" in result.anomalies[0] and "holding 195" in result.anomalies[0]


def test_bank_a_replica_missing_an_account_or_overdrawn_at_the_end_is_an_anomaly() -> None:
    h = History()
    h.info("bank", "setup", {"accounts": 2, "total": 200})
    final(h, workload="bank", cluster="r1", balances={"0": 200})
    final(h, workload="bank", cluster="r2", balances={"0": 205, "1": -5})
    result = check_bank(h)
    assert result.anomaly_count == 2
    assert [a.split(":")[0] for a in result.anomalies] == ["final read of r1", "final read of r2"]


def test_bank_whose_reads_all_hold_the_total_is_valid() -> None:
    h = History()
    h.info("bank", "setup", {"accounts": 2, "total": 200})
    op(h, "bank-1", "transfer", {"from": 0, "to": 1, "amount": 5}, OpType.UNKNOWN)
    op(h, "bank-0", "read", {"source": "meta"}, OpType.OK, {"source": "meta", "balances": {"0": 95, "1": 105}})
    final(h, workload="bank", cluster="r1", balances={"0": 95, "1": 105})
    assert check_bank(h).valid


# -- XDCR --------------------------------------------------------------------------------------


def _xdcr(changes_b: list[list[Any]], rejected_b: list[list[Any]], rows_b: list[list[Any]] | None = None) -> History:
    h = History()
    op(h, "xdcr-0", "write", {"c": "a", "k": 1, "v": "a-1"}, OpType.OK)
    op(h, "xdcr-1", "write", {"c": "b", "k": OWN_KEYS * 2 + 2, "v": "b-2"}, OpType.OK)
    a_changes = [[1, 100, "insert", 1, "a-1", "t1"], [2, 200, "insert", OWN_KEYS * 2 + 2, "b-2", "t2"]]
    final(h, workload="xdcr", cluster="a", cluster_id=1, rows=[[1, "a-1"], [OWN_KEYS * 2 + 2, "b-2"]],
          changes=a_changes, rejected=[])
    final(h, workload="xdcr", cluster="b", cluster_id=2,
          rows=rows_b if rows_b is not None else [[1, "a-1"], [OWN_KEYS * 2 + 2, "b-2"]],
          changes=changes_b, rejected=rejected_b)
    return h


B_OWN = [2, 200, "insert", OWN_KEYS * 2 + 2, "b-2", "u2"]


def test_xdcr_every_change_applied_once_on_every_member_is_valid() -> None:
    result = check_xdcr(_xdcr([B_OWN, [1, 100, "insert", 1, "a-1", "u1"]], []))
    assert result.valid, result.anomalies + result.lost


def test_xdcr_a_change_logged_as_rejected_counts_as_delivered() -> None:
    h = _xdcr([B_OWN], [[1, 100]], rows_b=[[1, "a-1"], [OWN_KEYS * 2 + 2, "b-2"]])
    assert check_xdcr(h).lost_count == 0


def test_xdcr_a_change_neither_applied_nor_rejected_is_lost_and_one_applied_twice_is_duplicated() -> None:
    assert "neither applied nor logged as rejected" in check_xdcr(_xdcr([B_OWN], [])).lost[0]
    twice = check_xdcr(_xdcr([B_OWN, [1, 100, "insert", 1, "a-1", "u1"], [1, 100, "update", 1, "a-1", "u3"]], []))
    assert "applied 2x" in twice.duplicated[0]


def test_xdcr_members_that_end_with_different_rows_diverged() -> None:
    result = check_xdcr(_xdcr([B_OWN, [1, 100, "insert", 1, "a-1", "u1"]], [], rows_b=[[OWN_KEYS * 2 + 2, "b-2"]]))
    assert any("differ at the end" in a for a in result.anomalies)


def test_xdcr_a_drain_that_left_a_peer_without_a_change_is_an_anomaly() -> None:
    h = _xdcr([B_OWN, [1, 100, "insert", 1, "a-1", "u1"]], [])
    h.record("drain-0", "drain-check", {"workload": "xdcr", "member": "a", "missing": {"compared": 1, "b": [[1, 100]]}})
    assert any("answered drained" in a for a in check_xdcr(h).anomalies)


def test_xdcr_a_key_that_ends_with_an_older_version_breaks_later_wins() -> None:
    h = History()
    op(h, "xdcr-0", "write", {"c": "a", "k": 1, "v": "a-1"}, OpType.OK)
    op(h, "xdcr-1", "write", {"c": "b", "k": 1, "v": "b-3"}, OpType.OK)
    a_changes = [[1, 100, "insert", 1, "a-1", "t1"], [2, 300, "update", 1, "b-3", "t2"]]
    b_changes = [[2, 300, "insert", 1, "b-3", "u1"], [1, 100, "update", 1, "a-1", "u2"]]
    for name, cluster_id, changes in (("a", 1, a_changes), ("b", 2, b_changes)):
        # both members agree, but on the change of the older version (100 < 300)
        final(h, workload="xdcr", cluster=name, cluster_id=cluster_id, rows=[[1, "a-1"]], changes=changes, rejected=[])
    result = check_xdcr(h)
    assert result.anomalies == ["key 1 ends as 'a-1', not as the change of the latest version (300, 2) ('b-3')"]
    assert result.stats["version_pairs"] == 1 and result.stats["version_order_against_real_time"] == 0


def test_xdcr_an_acknowledged_write_missing_from_its_members_change_log_is_lost() -> None:
    h = _xdcr([B_OWN, [1, 100, "insert", 1, "a-1", "u1"]], [])
    op(h, "xdcr-2", "write", {"c": "a", "k": 5, "v": "a-5"}, OpType.OK)
    assert check_xdcr(h).lost == ["a: acknowledged write 5=a-5 is not in its change log"]


def test_xdcr_an_unknown_write_never_logged_is_no_loss() -> None:
    h = _xdcr([B_OWN, [1, 100, "insert", 1, "a-1", "u1"]], [])
    op(h, "xdcr-2", "write", {"c": "a", "k": 5, "v": "a-5"}, OpType.UNKNOWN)
    assert check_xdcr(h).valid


# -- streams -----------------------------------------------------------------------------------


def _stream(events: list[list[Any]], complete: bool = True) -> History:
    h = History()
    op(h, "reg-0", "write", {"k": 1, "v": 10}, OpType.OK)
    op(h, "reg-0", "write", {"k": 1, "v": 11}, OpType.OK)
    op(h, "reg-0", "write", {"k": 1, "v": 12}, OpType.UNKNOWN)
    h.record("s-0", "pull", {"events": events})
    final(h, workload="s", complete=complete, until=1)
    return h


def test_stream_every_acknowledged_change_once_in_order_is_valid() -> None:
    result = check_stream(_stream([["t1", "insert", 1, 10], ["t2", "update", 1, 11]]), "s", "reg", "register")
    assert result.valid, result.anomalies


def test_stream_a_change_delivered_twice_or_never_is_caught() -> None:
    twice = check_stream(_stream([["t1", "insert", 1, 10], ["t2", "update", 1, 11], ["t3", "update", 1, 11]]),
                         "s", "reg", "register")
    assert twice.duplicated == ["(1, 11) delivered 2x"]
    never = check_stream(_stream([["t1", "insert", 1, 10]]), "s", "reg", "register")
    assert never.lost == ["(1, 11) acknowledged but never delivered"]


def test_stream_a_key_whose_changes_arrive_against_real_time_is_caught() -> None:
    result = check_stream(_stream([["t1", "insert", 1, 11], ["t2", "update", 1, 10]]), "s", "reg", "register")
    assert any("delivered before a value acknowledged before" in a for a in result.anomalies)


def test_stream_tokens_that_go_back_are_caught() -> None:
    result = check_stream(_stream([["t2", "insert", 1, 10], ["t1", "update", 1, 11]]), "s", "reg", "register")
    assert any("went back or repeated" in a for a in result.anomalies)


def test_stream_a_change_whose_write_failed_or_that_nobody_wrote_is_caught() -> None:
    h = History()
    op(h, "set-0", "add", 1, OpType.OK)
    op(h, "set-0", "add", 2, OpType.FAIL)
    h.record("s-0", "pull", {"events": [["t1", "insert", 1, "s1"], ["t2", "insert", 2, "s2"],
                                        ["t3", "insert", 3, "s3"]]})
    final(h, workload="s", complete=True, until=1)
    result = check_stream(h, "s", "set", "set")
    assert result.anomalies == ["2 delivered although its write failed", "3 delivered but never written"]


def test_stream_that_never_caught_up_cannot_prove_delivery() -> None:
    result = check_stream(_stream([["t1", "insert", 1, 10]], complete=False), "s", "reg", "register")
    assert not result.lost and "did not catch up" in result.anomalies[0]


# -- the history file ----------------------------------------------------------------------------


def test_a_history_file_is_checked_again_from_the_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    h = History(path)
    h.info("run", "start", {"workloads": {"set": {"kind": "set"}}})
    op(h, "set-0", "add", 1, OpType.OK)
    op(h, "set-0", "add", 2, OpType.OK)
    final(h, workload="set", cluster="r1", keys=[1])
    h.close()
    again = History.load(path)
    assert [o.to_json() for o in again] == [o.to_json() for o in h]
    (result,) = check_history(again, {"set": {"kind": "set"}})
    assert result.lost == ["r1:2"]
