"""Cypress-lite: the tree of nodes and their attributes, objects by id."""

from .tree import INTERNAL_PREFIX, MAP_NODE, OBJECT_TYPES, ROOT_ID, Cypress, Node, YPath, parse_ypath

__all__ = ["Cypress", "INTERNAL_PREFIX", "MAP_NODE", "Node", "OBJECT_TYPES", "ROOT_ID", "YPath", "parse_ypath"]
