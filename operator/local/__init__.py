"""``reptables up`` and ``reptables tour``: the whole product on one machine, without Kubernetes.

The runner (``runner.py``) reads the same manifests ``kubectl apply`` takes (``manifests.py``),
starts one engine per TableCluster and drives the operator's reconcile core and tracker with them;
its state directory (``state.py``) is what ``reptables status``, ``cluster stop|start|kill`` and ``env``
read and write, and ``edits.py`` is ``reptables promote|disable|enable`` (edits of the manifests
``up`` watches). ``demo.py`` is the demo ``up`` shows (in the first ``up`` on a data directory
only), ``tour.py`` the guided tour built on the runner. Nothing here imports kopf or the kopf
handlers.
"""
