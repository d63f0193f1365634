"""reptables.sparkapps — PySpark data source and bootstrap jobs (arrives with the bootstrap issue)."""
