"""The fault-injection tests need root and ``ip netns`` (CI runs as root on a machine like the
developers'); anywhere else they are skipped, and say why. nftables and tc are not a reason to skip:
``hack/bootstrap.sh`` installs them, and a machine without them fails the tests with the reason."""

from __future__ import annotations

import pytest

from reptables.testing.chaos.net import netns_unavailable

NETNS_PROBLEM = netns_unavailable()

needs_netns = pytest.mark.skipif(NETNS_PROBLEM is not None, reason=f"fault injection: {NETNS_PROBLEM}")
