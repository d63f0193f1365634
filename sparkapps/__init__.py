"""reptables.sparkapps: the PySpark side of reptables.

Spark is how the product moves table data in bulk (bootstrap copies of new replicas, verification),
so the engine's tables need a Spark data source: ``register(spark)`` makes ``format("reptables")``
known to a session, for ``spark.read`` of sorted, ordered and replicated dynamic tables at one
snapshot timestamp and ``df.write`` (upserts) into sorted ones. docs/spark.md says how to use it,
which options it takes and how YT types map to Spark types.

Needs the ``spark`` extra (``pip install 'reptables[spark]'``: pyspark 4 and pyarrow) and Java 17+;
the engine never imports this package.
"""

from .datasource import FORMAT, ReptablesDataSource, register
from .options import ReptablesSparkError

__all__ = ["FORMAT", "ReptablesDataSource", "ReptablesSparkError", "register"]
