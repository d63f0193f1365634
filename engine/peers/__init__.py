"""Cluster-to-cluster calls: the cluster directory and the internal API client."""

from .directory import DEFAULT_SYNC_TIMEOUT, MASKED_TOKEN, Peers, mask_tokens, parse_directory

__all__ = ["DEFAULT_SYNC_TIMEOUT", "MASKED_TOKEN", "Peers", "mask_tokens", "parse_directory"]
