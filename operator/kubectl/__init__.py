"""``kubectl reptables``: the status of replicated tables from the Kubernetes API, as one view.

``plugin.py`` is the plugin (the ``kubectl-reptables`` executable) and ``statusview.py`` the view
it renders — the same view ``reptables status`` renders from the local runner's state directory.
"""
