"""The reconcile core: desired state (a resource) plus observed state (the engines) gives actions and a status.

Plain Python, no operator framework: the kopf handlers (``handlers.py``) and the local runner
(``local/``) both drive it through ``dispatch.py``, the one table of which function serves which
kind. One module per kind (``clusters``, ``tables``, ``replicas``, ``collocations``, ``xdcr``); they
never import each other — what two of them share lives below them (``common``, ``directory``,
``xdcr_members``, and the steps one kind drives: ``replica_bootstrap``, ``xdcr_join``), and under
everything the world a reconciler sees (``world``) and the status conditions it writes
(``conditions``). ``pyproject.toml`` holds the layers as an import-linter contract.
"""
