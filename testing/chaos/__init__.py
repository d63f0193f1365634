"""Fault injection of our own, in the manner of Jepsen: engines in network namespaces, faults as
composable steps, workloads that record a history, and checkers that read it (docs/reliability.md).

Why: the promise is "nothing acknowledged is ever lost; nothing is delivered twice", and process
kills alone do not test it; partitions, clock trouble and faults at the risky moments (mode
switches, reshards, bootstraps, joins, drains) do.

The modules, bottom up:

* :mod:`.net` - the run's namespaces, veth pairs and bridge; partitions (nftables), loss, rate;
* :mod:`.clock` - a skewable wall clock for an engine (and why not libfaketime);
* :mod:`.cluster` - engines, the tracker and jobs in namespaces; :class:`~.cluster.ChaosRun` owns
  and removes all of it;
* :mod:`.history` - operations as invoke/ok/fail/unknown, and which errors prove a failure;
* :mod:`.nemesis` - faults with a heal, and the scheduler;
* :mod:`.workloads` and :mod:`.checkers` - what the clients do, and what the history must show;
* :mod:`.runner` - one run of one scenario, phase by phase; :mod:`.scenarios`,
  :mod:`.scenarios_bootstrap`, :mod:`.scenarios_xdcr` and :mod:`.catalog` - the scenarios;
* :mod:`.tracker` - the operator's tracker loop as a process of the run;
* ``python -m reptables.testing.chaos`` (``hack/chaos.sh``) - long runs, re-checks, clean-up.

Nothing is re-exported here: ``python -m reptables.testing.chaos.clock`` starts every engine of a
run, and must not import the scenarios first.
"""
