"""reptables.engine — the table engine: one process serves one table cluster.

The engine is layered like a small YTsaurus: timestamps and SQL storage at the bottom, Cypress-lite
(the node tree) and dynamic tables above them, tablet transactions with two-phase commit above
those, and the YT HTTP proxy protocol on top. The HTTP layer only translates requests into calls on
:class:`reptables.engine.cluster.Cluster`; it never holds table logic.
"""

__version__ = "0.1.0"
