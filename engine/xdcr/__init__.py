"""Active-active replication across clusters (seed 001, XDCR), a subsystem beside replication.

The node builds one :class:`XdcrService` behind the :class:`XdcrHost` protocol; the API's ``dr_*``
commands and the ``/internal/v1/xdcr_*`` routes call it. docs/xdcr.md tells what it does.
"""

from .conflicts import CONFLICT_COLUMNS, CONFLICT_SCHEMA, CONFLICTS_PATH
from .host import JOIN_ATTRIBUTE, REWIND_ATTRIBUTE, XdcrHost
from .service import XdcrService
from .settings import schema_signature
from .state import PeerState

__all__ = ["CONFLICTS_PATH", "CONFLICT_COLUMNS", "CONFLICT_SCHEMA", "JOIN_ATTRIBUTE", "REWIND_ATTRIBUTE", "PeerState",
           "XdcrHost", "XdcrService", "schema_signature"]
