"""The table node: the composition root (``Cluster``) that builds one engine's parts and services."""

from .cluster import Cluster
from .stream_service import PullAnswer

__all__ = ["Cluster", "PullAnswer"]
