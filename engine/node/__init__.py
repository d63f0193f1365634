"""The table node: the composition root that builds and wires every layer of one engine."""

from .cluster import Cluster

__all__ = ["Cluster"]
