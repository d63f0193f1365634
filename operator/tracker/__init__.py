"""The replicated table tracker: which replicas of a table are sync, decided and applied operator-wide.

Two halves that used to be ``tracker.py`` and ``tracking.py``, side by side and easy to confuse:
``decision.py`` is the pure decision of YTsaurus' tracker (plain values in, the mode changes out; no
I/O, no clock), and ``loop.py`` is the loop around it that probes the clusters, reads the tables'
replicas, asks for a decision and sends ``alter_table_replica``. Only the active operator runs the
loop.
"""
