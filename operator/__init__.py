"""reptables.operator — the control plane: CRD models, reconcile core, tracker and the local runner.

For now it holds the ``reptables`` command line and the local walkthrough (``reptables up``); the
kopf operator arrives with its own issue. Never import this folder as top-level ``operator``: it is
always ``reptables.operator`` (a top-level ``operator`` would shadow the standard library).
"""
