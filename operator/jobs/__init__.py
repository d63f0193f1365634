"""Running the operator's Spark jobs: the bootstrap copy and verify of a new replica, and the XDCR join.

The reconcile core never waits for a job: it starts one through a :class:`~.launcher.Launcher` and
looks at it on a later pass (``launcher.py``). Two launchers implement it: local processes with local
Spark (``processes.py``, for ``reptables up`` and the tests) and one SparkApplication per attempt for
the kubeflow spark-operator (``spark_applications.py``, on Kubernetes). The package is named after
what it runs, not after the bootstrap: ``bootstrap`` is already the name of the Spark job
(``reptables.sparkapps.bootstrap``) and of the engine's replica bootstrap
(``reptables.engine.replication.bootstrap``), and the launchers run the XDCR join too.
"""
