"""The HTTP API: routes, the command table, authentication, formats."""

from .app import LeaderGate, create_app, standby_app
from .formats import Format, dump_rows, dump_structured, load_rows, load_structured, parse_format
from .server import server_options

__all__ = ["Format", "LeaderGate", "create_app", "dump_rows", "dump_structured", "load_rows", "load_structured",
           "parse_format", "server_options", "standby_app"]
