"""The "reptables" PySpark data source: ``spark.read.format("reptables")`` and ``df.write.format("reptables")``.

Why a class this thin: Spark instantiates a :class:`~pyspark.sql.datasource.DataSource` in several
Python workers (once to learn the schema, once to plan a read, once to plan a write) and pickles the
reader or writer it returns to every task. So this class only parses its options; the table's schema
comes from its ``@schema`` each time it is asked, and the reader (``reader.py``) and the writer
(``writer.py``) carry what their tasks need. docs/spark.md is the user's guide.
"""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceWriter
from pyspark.sql.types import StructType

from reptables.engine.errors import YtError

from .changes_source import ReptablesChangesDataSource
from .options import SourceOptions
from .reader import ReptablesReader
from .schema_mapping import spark_schema
from .tables import TableInfo
from .writer import ReptablesWriter

#: the format name: ``spark.read.format(FORMAT)``
FORMAT = "reptables"


class ReptablesDataSource(DataSource):
    """Reads sorted, ordered and replicated dynamic tables at a timestamp; writes sorted ones (upserts)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        opts = SourceOptions.parse(self.options)
        try:
            with opts.client() as client:
                info = TableInfo.fetch(client, opts.path)
        except (YtError, ValueError) as exc:
            raise opts.failure("read", exc) from None
        return spark_schema(info.columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        return ReptablesReader(SourceOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return ReptablesWriter(SourceOptions.parse(self.options), schema, overwrite)


def register(spark: SparkSession) -> None:
    """Make ``format("reptables")`` and ``format("reptables-changes")`` (its change stream, changes_source.py)
    known to ``spark`` (per session, as Spark registers Python data sources)."""
    spark.dataSource.register(ReptablesDataSource)
    spark.dataSource.register(ReptablesChangesDataSource)
