"""The system tables: the engine's own state in SQL, beside the user tables.

Every piece of state that must survive a restart and change atomically with user rows is a row in
one of these tables, written in the same SQL transaction as the rows it describes: the Cypress
tree (``_rt_nodes``), tablet counters, prepare records and commit decisions of two-phase commits,
replication progress on both sides, read locks, the change log of change streams and its
consumers, and XDCR's row versions and progress. That shared transaction is what the engine's
exactly-once and crash-safety guarantees rest on (a sink record advances with the rows it
describes, a decision is durable with the queue rows it covers), so a new piece of state belongs
here, not in a file beside the database.

What is tricky: these definitions are the on-disk format. ``Storage.create_schema`` creates the
tables that are missing and never alters one, so a data directory made by an older engine keeps
the shape it was made with (``_rt_xdcr_rows``'s ``sqlite_with_rowid=False``, say, applies to new
directories only). A changed column reaches new data directories only; the engine has no
migration of existing ones.
"""

from __future__ import annotations

import sqlalchemy as sa

SYSTEM_METADATA = sa.MetaData()

meta_table = sa.Table(
    "_rt_meta", SYSTEM_METADATA,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

nodes_table = sa.Table(
    "_rt_nodes", SYSTEM_METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("parent_id", sa.String(64), nullable=True, index=True),
    sa.Column("name", sa.Text, nullable=True),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("attributes", sa.Text, nullable=False),
    sa.Column("value", sa.Text, nullable=True),
)

tablets_table = sa.Table(
    "_rt_tablets", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("tablet_index", sa.Integer, primary_key=True),
    sa.Column("row_count", sa.BigInteger, nullable=False, default=0),
    sa.Column("trimmed_row_count", sa.BigInteger, nullable=False, default=0),
)

prepared_table = sa.Table(
    "_rt_prepared", SYSTEM_METADATA,
    sa.Column("transaction_id", sa.String(64), primary_key=True),
    sa.Column("participant", sa.String(200), primary_key=True),
    sa.Column("start_timestamp", sa.BigInteger, nullable=False),
    sa.Column("prepare_timestamp", sa.BigInteger, nullable=False),
    #: the cluster coordinating the transaction; NULL when it is this cluster
    sa.Column("coordinator", sa.String(200), nullable=True),
    sa.Column("payload", sa.Text, nullable=False),
)

#: PostgreSQL: the token of the last write transaction that changed anything (one row, id 1), written
#: by that transaction itself just before its COMMIT (storage/sql.py). It answers "did my commit
#: happen?" when the answer to a COMMIT is lost with the connection, and "does the database still
#: hold everything I was told committed?" after the server restarts. (A transaction id cannot: the
#: server hands a crashed transaction's id out again after its restart.)
last_commit_table = sa.Table(
    "_rt_last_commit", SYSTEM_METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("token", sa.BigInteger, nullable=False),
)

#: PostgreSQL: who serves the database (one row, id 1; storage/leadership.py). ``epoch`` grows by one
#: with every new holder and is the fencing token: every write transaction of the holder compares it,
#: under a share lock of this row, in its last statement before COMMIT (storage/sql.py), so a write of
#: an engine that another has replaced rolls back. ``expires_at`` is the lease of the leader of a
#: leader/standby group, by the database's clock (renewed every third of the lease; a standby takes
#: the row over once it has passed); NULL for a single engine (``serve`` without ``--standby``),
#: which holds the row until it stops. ``address`` is where the holder serves (what a standby names).
leader_table = sa.Table(
    "_rt_leader", SYSTEM_METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("address", sa.Text, nullable=True),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
)

commits_table = sa.Table(
    "_rt_commits", SYSTEM_METADATA,
    sa.Column("transaction_id", sa.String(64), primary_key=True),
    sa.Column("commit_timestamp", sa.BigInteger, nullable=False),
    sa.Column("participants", sa.Text, nullable=False),
)

#: meta-cluster side: how far each replica has replicated each tablet of a replicated table
replica_progress_table = sa.Table(
    "_rt_replica_progress", SYSTEM_METADATA,
    sa.Column("replica_id", sa.String(64), primary_key=True),
    sa.Column("tablet_index", sa.Integer, primary_key=True),
    sa.Column("row_index", sa.BigInteger, nullable=False),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
)

#: replica-cluster side: the last replicated row per (upstream replica, tablet); written in the
#: same SQL transaction as the rows it describes, which is what makes delivery exactly once
replica_sink_table = sa.Table(
    "_rt_replica_sink", SYSTEM_METADATA,
    sa.Column("upstream_replica_id", sa.String(64), primary_key=True),
    #: a tablet, or a bootstrap copy's chunk number (partition << 32 | chunk: 64 bits)
    sa.Column("tablet_index", sa.BigInteger, primary_key=True),
    sa.Column("row_index", sa.BigInteger, nullable=False),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
)

read_locks_table = sa.Table(
    "_rt_read_locks", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("row_key", sa.Text, primary_key=True),
    sa.Column("lock_mask", sa.Integer, primary_key=True),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
)

#: the change log of every sorted and ordered table (change streams, docs/streams.md): one row per
#: changed row, appended in the commit's SQL transaction. ``(timestamp, seq)`` is a change's position
#: in its table's stream: commit order, then order within the commit (``seq`` grows per table, so a
#: change applied later at an equal timestamp - a replica receiving one commit in two batches -
#: still sorts after). A replicated table's stream is its replication queue instead.
changes_table = sa.Table(
    "_rt_changes", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("timestamp", sa.BigInteger, primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True),
    sa.Column("tablet_index", sa.Integer, nullable=False),
    #: insert, update, delete (sorted tables) or append (ordered tables)
    sa.Column("kind", sa.String(16), nullable=False),
    #: JSON: {"row": the new row} or {"key": [...]} for a delete; ordered rows add "row_index"
    sa.Column("payload", sa.Text, nullable=False),
)

#: registered stream consumers (YT's queue consumers): their offset is an event token position;
#: a vital one holds the trimming of its table's changes at its offset
consumers_table = sa.Table(
    "_rt_consumers", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("consumer_path", sa.String(1000), primary_key=True),
    sa.Column("vital", sa.Boolean, nullable=False),
    sa.Column("offset_timestamp", sa.BigInteger, nullable=False),
    sa.Column("offset_seq", sa.BigInteger, nullable=False),
)

#: XDCR (docs/xdcr.md): the version of every row of an XDCR table - the cluster id and commit
#: timestamp of its last change, a delete's too (a tombstone) - the row's "hidden columns", kept
#: beside it and changed in the same SQL transaction
xdcr_rows_table = sa.Table(
    "_rt_xdcr_rows", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("row_key", sa.Text, primary_key=True),
    sa.Column("cluster_id", sa.Integer, nullable=False),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
    sa.Column("deleted", sa.Boolean, nullable=False),
    #: the delete horizon: the version of the newest delete in the row's history (a tombstone's
    #: own; None: none), which orders changes before their versions do (``tablets/xdcr.py``)
    sa.Column("horizon_timestamp", sa.BigInteger, nullable=True),
    sa.Column("horizon_cluster_id", sa.Integer, nullable=True),
    # small rows found only by their key: kept in the key's B-tree itself (SQLite), with no rowid
    # table beside a second copy of the key in an index. A data directory made before keeps its table
    sqlite_with_rowid=False,
)

#: XDCR, the sending side: how far each peer has this cluster's changes of each XDCR table (a
#: change-log position); saved when the peer acknowledged a batch
xdcr_progress_table = sa.Table(
    "_rt_xdcr_progress", SYSTEM_METADATA,
    sa.Column("peer", sa.String(200), primary_key=True),
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
)

#: XDCR, the receiving side: the last change-log position applied per (table, origin cluster),
#: written in the SQL transaction that applies the batch: a retried batch is recognised
xdcr_sink_table = sa.Table(
    "_rt_xdcr_sink", SYSTEM_METADATA,
    sa.Column("table_id", sa.String(64), primary_key=True),
    sa.Column("origin_cluster_id", sa.Integer, primary_key=True),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
)
