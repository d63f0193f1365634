"""The operator's settings, resolved once when ``reptables operator`` starts.

Why an object and not module constants: the operator used to read its namespace and periods from
the environment when ``handlers.py`` was imported, so importing the module had side effects and a
bad value (``REPTABLES_STATUS_REFRESH=soon``) broke imports. Now the CLI builds one
:class:`OperatorSettings` from its options and the environment (here, in :meth:`resolve`: the only
place that knows the variable names and defaults) and hands it to kopf; the startup handler builds
the runtime from it. Nothing in the operator reads ``os.environ`` at import.

Each value comes from the command line option, else the environment variable, else the default:

=====================  ===========================  ==========================================
setting                option                       environment (default)
=====================  ===========================  ==========================================
operator namespace     ``--operator-namespace``     ``REPTABLES_NAMESPACE``, else ``POD_NAMESPACE``
                                                    (``reptables-system``)
watched namespaces     ``--namespace`` (repeated)   ``POD_NAMESPACE`` (``default``); the operator
                                                    namespace is always added
credential namespaces  ``--credentials-namespace``  ``REPTABLES_CREDENTIALS_NAMESPACES`` (comma-
                       (repeated)                   separated); the operator namespace is always
                                                    one, and each is watched
status refresh         ``--status-refresh``         ``REPTABLES_STATUS_REFRESH`` (5 s)
tracker period         ``--tracker-period``         ``REPTABLES_TRACKER_PERIOD`` (1 s)
bootstrap jobs         (none)                       ``REPTABLES_SPARK_JOBS``: JSON of the chart's
                                                    ``bootstrap.spark`` values (unset: no launcher)
=====================  ===========================  ==========================================

The chart sets the variables (the operator namespace is the release namespace, ``POD_NAMESPACE``
comes from the downward API), so they stay the interface for deployments; the options exist for
running the operator by hand.

This module imports nothing of the operator: the ``reptables`` command loads it for every
sub-command (``engine serve`` included), which must not pull in the tracker or kopf.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ENV_OPERATOR_NAMESPACE = "REPTABLES_NAMESPACE"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
ENV_STATUS_REFRESH = "REPTABLES_STATUS_REFRESH"
ENV_TRACKER_PERIOD = "REPTABLES_TRACKER_PERIOD"
ENV_CREDENTIALS_NAMESPACES = "REPTABLES_CREDENTIALS_NAMESPACES"
ENV_SPARK_JOBS = "REPTABLES_SPARK_JOBS"

DEFAULT_OPERATOR_NAMESPACE = "reptables-system"
DEFAULT_WATCHED_NAMESPACE = "default"
DEFAULT_STATUS_REFRESH = 5.0
DEFAULT_TRACKER_PERIOD = 1.0
"""The tracker loop's own default (``tracker.loop.CHECK_PERIOD``); a test keeps the two equal."""
DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"
DEFAULT_METRICS_PORT = 8081
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


_SPARK_MEMORY = re.compile(r"^[0-9]+[kmgtKMGT]?$")


@dataclass(frozen=True)
class SparkJobSettings:
    """How the bootstrap and verify jobs run as SparkApplications (the chart's ``bootstrap.spark``).

    Everything the launcher (``jobs/spark_applications.py``) puts into an app that is not about the one job: the
    image, its Spark version and main file, resources, the driver's service account, how long a
    finished app is kept and how long one may wait to start.
    """

    image: str
    image_pull_policy: str = "IfNotPresent"
    service_account: str = "spark-operator-spark"
    spark_version: str = "4.0.1"
    main_application_file: str = "local:///opt/reptables/sparkapp.py"
    time_to_live_seconds: int = 3600
    """The spark-operator deletes a finished app (and so its credentials Secret) this long after it ended."""
    submit_timeout_seconds: int = 600
    """An app still not RUNNING this long after its creation is deleted and counts as a failed attempt."""
    driver_cores: int = 1
    driver_memory: str = "1g"
    executor_instances: int = 2
    executor_cores: int = 1
    executor_memory: str = "2g"
    spark_conf: tuple[tuple[str, str], ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError(f"{ENV_SPARK_JOBS}: image must name the job image")
        if self.image_pull_policy not in ("Always", "IfNotPresent", "Never"):
            raise ValueError(f"{ENV_SPARK_JOBS}: imagePullPolicy must be Always, IfNotPresent or Never, "
                             f"got {self.image_pull_policy!r}")
        for name in ("time_to_live_seconds", "submit_timeout_seconds", "driver_cores", "executor_instances",
                     "executor_cores"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{ENV_SPARK_JOBS}: {_camel(name)} must be a positive integer, "
                                 f"got {getattr(self, name)!r}")
        for name in ("driver_memory", "executor_memory"):
            if not _SPARK_MEMORY.match(str(getattr(self, name))):
                raise ValueError(f"{ENV_SPARK_JOBS}: {_camel(name)} must be a Spark memory size such as 512m or "
                                 f"2g, got {getattr(self, name)!r}")

    @classmethod
    def from_json(cls, text: str) -> SparkJobSettings:
        """Parse the ``REPTABLES_SPARK_JOBS`` value; ValueError naming the key that is wrong."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{ENV_SPARK_JOBS} is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{ENV_SPARK_JOBS} must be a JSON object, got {type(raw).__name__}")
        raw = dict(raw)
        raw.pop("enabled", None)
        driver, executor = raw.pop("driver", None) or {}, raw.pop("executor", None) or {}
        if not isinstance(driver, dict) or not isinstance(executor, dict):
            raise ValueError(f"{ENV_SPARK_JOBS}: driver and executor must be objects")
        values: dict[str, object] = {}
        simple = {"image": str, "imagePullPolicy": str, "serviceAccount": str, "sparkVersion": str,
                  "mainApplicationFile": str, "timeToLiveSeconds": int, "submitTimeoutSeconds": int}
        for key, value in raw.items():
            if key in ("sparkConf", "nodeSelector"):
                if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                    raise ValueError(f"{ENV_SPARK_JOBS}: {key} must map names to strings")
                values[_snake(key)] = tuple(sorted(value.items()))
            elif key in simple:
                if not isinstance(value, simple[key]) or isinstance(value, bool):
                    raise ValueError(f"{ENV_SPARK_JOBS}: {key} must be a {simple[key].__name__}, got {value!r}")
                values[_snake(key)] = value
            else:
                raise ValueError(f"{ENV_SPARK_JOBS}: unknown key {key!r}")
        for prefix, part, keys in (("driver", driver, ("cores", "memory")),
                                   ("executor", executor, ("instances", "cores", "memory"))):
            for key, value in part.items():
                if key not in keys:
                    raise ValueError(f"{ENV_SPARK_JOBS}: unknown key {prefix}.{key}")
                values[f"{prefix}_{key}"] = value
        return cls(**values)  # type: ignore[arg-type]


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _camel(name: str) -> str:
    """``driver_memory`` -> ``driver.memory``, ``submit_timeout_seconds`` -> ``submitTimeoutSeconds``."""
    head, *rest = name.split("_")
    if head in ("driver", "executor"):
        return f"{head}.{''.join(rest)}"
    return head + "".join(p.title() for p in rest)


@dataclass(frozen=True)
class OperatorSettings:
    """Everything ``reptables operator`` was told, resolved (see the module docstring for the sources)."""

    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE
    """Where the operator runs; TableCluster credential Secrets without a namespace are looked up here."""
    namespaces: tuple[str, ...] = (DEFAULT_WATCHED_NAMESPACE, DEFAULT_OPERATOR_NAMESPACE)
    """Namespaces watched (sorted, the operator namespace included); empty with ``all_namespaces``."""
    all_namespaces: bool = False
    """Watch every namespace (kopf's ``clusterwide``)."""
    credentials_namespaces: tuple[str, ...] = ()
    """Namespaces besides the operator namespace whose Secrets TableClusters may take their token
    from (sorted); a TableCluster naming a Secret elsewhere is refused."""
    status_refresh: float = DEFAULT_STATUS_REFRESH
    """Seconds between status refreshes (and drift corrections) of each resource."""
    tracker_period: float = DEFAULT_TRACKER_PERIOD
    """Seconds between two checks of the replicated table tracker (operator-wide)."""
    standalone: bool = False
    """Run without peering: this is the only operator."""
    peering: str | None = None
    """The kopf peering object shared by the operators of a highly available deployment."""
    priority: int | None = None
    """Peering priority (with ``peering`` always set: random unless given, so peers never tie)."""
    liveness: str = DEFAULT_LIVENESS
    """URL kopf serves its liveness probe on."""
    metrics_port: int = DEFAULT_METRICS_PORT
    """Port of the Prometheus ``/metrics`` endpoint; 0 turns it off."""
    verbose: bool = False
    """Debug logging."""
    spark_jobs: SparkJobSettings | None = None
    """How bootstrap jobs run as SparkApplications; None: this operator cannot run them (they wait)."""

    def __post_init__(self) -> None:
        for name in ("status_refresh", "tracker_period"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be a port number (0: off), got {self.metrics_port}")
        if self.all_namespaces and self.namespaces:
            raise ValueError("namespaces must be empty when all_namespaces is set")

    @property
    def secret_namespaces(self) -> frozenset[str]:
        """Every namespace TableClusters may take credentials from: the operator's and the extra ones."""
        return frozenset({self.operator_namespace, *self.credentials_namespaces})

    @classmethod
    def resolve(
        cls,
        environ: Mapping[str, str],
        *,
        namespaces: Iterable[str] | None = None,
        all_namespaces: bool = False,
        operator_namespace: str | None = None,
        credentials_namespaces: Iterable[str] | None = None,
        status_refresh: float | None = None,
        tracker_period: float | None = None,
        standalone: bool = False,
        peering: str | None = None,
        priority: int | None = None,
        liveness: str = DEFAULT_LIVENESS,
        metrics_port: int = DEFAULT_METRICS_PORT,
        verbose: bool = False,
        spark_jobs: SparkJobSettings | None = None,
    ) -> OperatorSettings:
        """The settings from command line values (``None``: not given) and ``environ``.

        Raises ValueError naming the option or variable when a value is not usable.
        """
        pod_namespace = environ.get(ENV_POD_NAMESPACE) or None
        operator_namespace = (operator_namespace or environ.get(ENV_OPERATOR_NAMESPACE) or pod_namespace
                              or DEFAULT_OPERATOR_NAMESPACE)
        if credentials_namespaces:
            extra, source = list(credentials_namespaces), "--credentials-namespace"
        else:
            extra = [n.strip() for n in environ.get(ENV_CREDENTIALS_NAMESPACES, "").split(",") if n.strip()]
            source = ENV_CREDENTIALS_NAMESPACES
        for name in extra:
            if not _DNS_LABEL.match(name):
                raise ValueError(f"{source} gives {name!r}, which is not a namespace name")
        credentials = tuple(sorted(set(extra) - {operator_namespace}))
        watched: tuple[str, ...] = ()
        if not all_namespaces:
            wanted = list(namespaces or ()) or [pod_namespace or DEFAULT_WATCHED_NAMESPACE]
            watched = tuple(sorted({*wanted, *credentials, operator_namespace}))
        if peering and priority is None:
            # kopf pauses every operator when the highest priority is shared: break ties at random
            priority = 1 + secrets.randbelow(1_000_000)
        return cls(
            operator_namespace=operator_namespace, namespaces=watched, all_namespaces=all_namespaces,
            credentials_namespaces=credentials,
            status_refresh=_seconds(status_refresh, environ, ENV_STATUS_REFRESH, DEFAULT_STATUS_REFRESH),
            tracker_period=_seconds(tracker_period, environ, ENV_TRACKER_PERIOD, DEFAULT_TRACKER_PERIOD),
            standalone=standalone, peering=peering, priority=priority, liveness=liveness,
            metrics_port=metrics_port, verbose=verbose,
            spark_jobs=spark_jobs or (SparkJobSettings.from_json(environ[ENV_SPARK_JOBS])
                                      if environ.get(ENV_SPARK_JOBS) else None))


def _seconds(given: float | None, environ: Mapping[str, str], variable: str, default: float) -> float:
    if given is not None:
        value, source = given, "the command line"
    elif environ.get(variable):
        text = environ[variable]
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{variable}={text!r} is not a number of seconds") from None
        source = variable
    else:
        return default
    if not value > 0:
        raise ValueError(f"{source} gives {value!r}; a period must be a positive number of seconds")
    return value
