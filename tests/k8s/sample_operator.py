"""A tiny kopf operator used only by test_emulator.py to prove that kopf works against the emulator.

For ``widgets.test.reptables.io`` (a test CRD defined in test_emulator.py):

* on create: kopf adds its finalizer (because there is a non-optional delete handler; it does so with
  a JSON patch guarded by a ``test`` op on ``metadata.resourceVersion``), the handler writes a Ready
  condition to ``.status`` (through the ``/status`` subresource) and posts a ``WidgetCreated`` event;
* on a ``spec.size`` change: the condition and ``status.observedGeneration`` are updated;
* on delete: a ``WidgetDeleted`` event is posted, then kopf removes its finalizer so that the API
  server completes the deletion.
"""

from __future__ import annotations

from typing import Any

import kopf

GROUP, VERSION, PLURAL = "test.reptables.io", "v1", "widgets"
FINALIZER = "test.reptables.io/widget-cleanup"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = 20  # logging.INFO: post kopf.info() events
    settings.watching.reconnect_backoff = 0.2


def _ready(message: str, generation: int | None) -> dict[str, Any]:
    return {
        "observedGeneration": generation,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled", "message": message}],
    }


@kopf.on.create(GROUP, VERSION, PLURAL)
def widget_created(body: kopf.Body, spec: kopf.Spec, name: str, patch: kopf.Patch, **_: Any) -> None:
    patch.status.update(_ready(f"size={spec.get('size')}", body.metadata.get("generation")))
    kopf.info(body, reason="WidgetCreated", message=f"widget {name} created with size {spec.get('size')}")


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec.size")
def widget_resized(body: kopf.Body, new: Any, patch: kopf.Patch, **_: Any) -> None:
    patch.status.update(_ready(f"size={new}", body.metadata.get("generation")))


@kopf.on.delete(GROUP, VERSION, PLURAL)
def widget_deleted(body: kopf.Body, name: str, **_: Any) -> None:
    kopf.info(body, reason="WidgetDeleted", message=f"widget {name} cleaned up")
