"""Every scenario of the fault runs, by name (what ``hack/chaos.sh --scenarios`` takes)."""

from __future__ import annotations

from .runner import Scenario
from .scenarios import REPLICATED_SCENARIOS
from .scenarios_bootstrap import BOOTSTRAP_SCENARIOS
from .scenarios_xdcr import XDCR_SCENARIOS

__all__ = ["SCENARIOS"]

SCENARIOS: dict[str, Scenario] = {s.name: s for s in [*REPLICATED_SCENARIOS, *BOOTSTRAP_SCENARIOS, *XDCR_SCENARIOS]}
