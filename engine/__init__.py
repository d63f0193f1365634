"""reptables.engine — the table engine: one process serves one table cluster.

The engine is layered like a small YTsaurus: base modules and SQL storage at the bottom, dynamic
tables (``tablets``) above them, Cypress-lite (``cypress``) and tablet transactions with two-phase
commit (``transactions``) above those, cluster-to-cluster calls (``peers``) and replicated tables
(``replication``) next, the table node (``node``: the composition root and the commands) and the YT
HTTP proxy protocol (``api``) on top. The HTTP layer only translates requests into calls on
:class:`reptables.engine.node.Cluster`; it never holds table logic. docs/architecture.md is the map
(layers, the path of a write, the lock order); ``lint-imports`` checks the direction of imports.
"""

__version__ = "0.1.0"
