"""Fault injection (issue: the project's own Jepsen-style suite): engines in network namespaces,
faults as composable steps, workloads that record a history, and checkers that read it."""
