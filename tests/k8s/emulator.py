"""A Kubernetes API emulator for operator tests, built on kmock's ``KubernetesEmulator``.

No Kubernetes API server can run on the test machines, so operator tests run kopf as a real process
against this emulator over real HTTP on 127.0.0.1. It behaves like an API server where kopf and the
reptables operator need it:

* discovery (``/api``, ``/apis``, ``/apis/{group}[/{version}]``) for the built-in resources (kmock's
  bundled list: ``v1`` namespaces/events/secrets/configmaps/..., ``apps``, ``batch``, ``coordination``,
  ``apiextensions.k8s.io/v1/customresourcedefinitions``, ...), for kopf's peering CRDs
  (``kopf.dev/v1`` ClusterKopfPeering/KopfPeering), for every CRD YAML in the given directories
  (default: ``crds/`` of the repo) and the SparkApplication CRD (``../shared/thirdparty``);
* CRDs are also served as objects (kopf's resource observer watches them), and CRDs created through
  the API are registered on the fly (and unregistered when deleted);
* metadata: ``uid``, ``creationTimestamp``, ``resourceVersion`` (a cluster-wide counter bumped on every
  write), ``generation`` (1 on create; bumped only when something other than metadata/status changes),
  ``generateName``; no-op writes change nothing (no new resourceVersion, no watch event);
* the status subresource: writes to ``/status`` change only ``.status``, writes to the main resource
  ignore ``.status``; ``.status`` is dropped on create;
* PUT, merge patch (RFC 7386, with null-deletes), JSON patch (RFC 6902, incl. kopf's ``test`` op on
  ``/metadata/resourceVersion``; a failed test is a 422 as kopf expects), strategic merge and apply
  patches treated as merge patches;
* optimistic concurrency: a stale ``metadata.resourceVersion`` in a PUT/patch is a 409 Conflict;
* finalizer-aware deletion (``deletionTimestamp`` while finalizers exist; removal when they are gone;
  no new finalizers on deleting objects), ownerReferences garbage collection (background/orphan),
  namespace termination that deletes the namespace's content;
* CRD schema handling on every write (create/update/patch, main resource and ``/status``): pruning of
  unknown fields (unless ``x-kubernetes-preserve-unknown-fields``), structural defaulting, OpenAPI
  validation with ``jsonschema`` (types, nullable, required, enum, minimum/maximum (exclusive),
  multipleOf, pattern, min/maxLength, min/maxItems, min/maxProperties, formats date-time/byte/uuid/
  ipv4/ipv6, int-or-string, anyOf/oneOf/allOf/not), list-type set/map uniqueness, and CEL rules
  (``x-kubernetes-validations`` with message, messageExpression, reason, fieldPath, and transition
  rules with ``oldSelf`` evaluated on updates for correlatable values) using cel-python with the
  common Kubernetes string/list extension functions. Invalid objects are rejected with a 422 Status
  whose message reads like a real API server's, e.g.
  ``Widget.test.reptables.io "w1" is invalid: spec.size: Invalid value: 0: spec.size in body should be
  greater than or equal to 1``, and nothing is stored;
* list (``labelSelector``, ``fieldSelector``, ``limit``/``continue``) and watch (``resourceVersion`` to
  resume from, ``timeoutSeconds``, ``allowWatchBookmarks``, ``sendInitialEvents``; 410 Expired when
  too old; selector-aware ADDED/DELETED transitions).

Usage in tests (the fixture lives here; import it into a conftest.py to use it anywhere)::

    # tests/operator/conftest.py
    from tests.k8s.emulator import k8s_api  # noqa: F401  (re-exported pytest fixture)

    def test_something(k8s_api, tmp_path):
        kubeconfig = k8s_api.kubeconfig(tmp_path / "kubeconfig")
        with KopfProcess(["--standalone", "--namespace", "test", "-m", "reptables.operator.handlers"],
                         kubeconfig=kubeconfig, log_path=tmp_path / "kopf.log") as kopf:
            k8s_api.wait_for_watch("tablereplicas", namespace="test")
            k8s_api.create({"apiVersion": "reptables.io/v1alpha1", "kind": "TableReplica", ...})
            k8s_api.wait_for(lambda: k8s_api.get("tablereplicas", "r1", "test").get("status"))

Or, without the fixture: ``with K8sApi(crd_dirs=[...]) as api: ...`` (also for module-scoped fixtures).
Run it by hand with ``python -m tests.k8s.emulator --kubeconfig /tmp/kubeconfig``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import dataclasses
import datetime
import ipaddress
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import celpy
import celpy.celtypes as ct
import httpx
import jsonpatch
import jsonpointer
import jsonschema
import kmock
import pytest
import yaml
from celpy.evaluation import CELEvalError, base_functions
from kmock._internal import enums, k8s_views, rendering

from reptables.testing import wait_for

logger = logging.getLogger("tests.k8s.emulator")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CRD_DIR = REPO_ROOT / "crds"
THIRDPARTY_DIR = Path(os.environ.get("REPTABLES_THIRDPARTY_DIR", REPO_ROOT.parent / "shared" / "thirdparty"))
SPARK_CRD_PATH = THIRDPARTY_DIR / "sparkoperator.k8s.io_sparkapplications.yaml"

CUSTOM_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = ("get", "patch", "update")
EXCLUDED_BUILTIN_GROUPS = frozenset({"gateway.networking.k8s.io", "metrics.k8s.io"})
SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp",
                   "deletionGracePeriodSeconds", "generation", "selfLink", "managedFields")
INITIAL_EVENTS_END = "k8s.io/initial-events-end"

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_RE = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_DNS1123_LABEL_RE = re.compile(rf"^{_DNS1123_LABEL}$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_OLDSELF_RE = re.compile(r"\boldSelf\b")
_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"


# ------------------------------------------------------------------------------------------------
# Small helpers
# ------------------------------------------------------------------------------------------------

def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _value_repr(value: Any) -> str:
    """Render a value in error messages roughly as the Go API server does (%v / %q)."""
    if isinstance(value, str | bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _kube_version_key(version: str) -> tuple[int, int, int, str]:
    """Kubernetes version priority: GA > beta > alpha > others; higher numbers first."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0), version)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (returns a new value; ``None`` deletes keys)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _split_selector(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current.strip())
    return terms


def label_selector_matcher(selector: str | None) -> Callable[[Mapping[str, str]], bool]:
    """Parse a label selector (``a=b,c!=d,e in (f,g),h notin (i),j,!k``) into a predicate on labels."""
    if not selector:
        return lambda labels: True
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for term in _split_selector(selector):
        if m := re.fullmatch(r"([^\s!=]+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif m := re.fullmatch(r"([^\s!=]+)\s*(==|=|!=)\s*(\S*)", term):
            key, op, value = m.groups()
            if op == "!=":
                checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif m := re.fullmatch(r"!\s*(\S+)", term):
            checks.append(lambda labels, k=m.group(1): k not in labels)
        elif re.fullmatch(r"\S+", term):
            checks.append(lambda labels, k=term: k in labels)
        else:
            raise ValueError(f"unable to parse requirement: {term!r}")
    return lambda labels: all(check(labels) for check in checks)


def field_selector_matcher(selector: str | None) -> Callable[[Mapping[str, Any]], bool]:
    """Parse a field selector (``metadata.name=x,metadata.namespace!=y,status.phase=Running``)."""
    if not selector:
        return lambda obj: True
    checks: list[Callable[[Mapping[str, Any]], bool]] = []
    for term in _split_selector(selector):
        m = re.fullmatch(r"([^\s!=]+)\s*(==|=|!=)\s*(\S*)", term)
        if not m:
            raise ValueError(f"invalid field selector: {term!r}")
        path, op, value = m.groups()

        def lookup(obj: Mapping[str, Any], path: str = path) -> str:
            node: Any = obj
            for part in path.split("."):
                node = node.get(part) if isinstance(node, Mapping) else None
            return "" if node is None else str(node).lower() if isinstance(node, bool) else str(node)

        if op == "!=":
            checks.append(lambda obj, lookup=lookup, v=value: lookup(obj) != v)
        else:
            checks.append(lambda obj, lookup=lookup, v=value: lookup(obj) == v)
    return lambda obj: all(check(obj) for check in checks)


# ------------------------------------------------------------------------------------------------
# Field errors (the "causes" of a 422 Invalid status)
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FieldError:
    field: str
    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.field or '<nil>'}: {self.detail}"

    @classmethod
    def invalid(cls, field: str, value: Any, message: str, reason: str = "FieldValueInvalid") -> FieldError:
        return cls(field, reason, f"Invalid value: {_value_repr(value)}: {message}")

    @classmethod
    def type_invalid(cls, field: str, value: Any, expected: str) -> FieldError:
        actual = _type_name(value)
        return cls(field, "FieldValueTypeInvalid",
                   f'Invalid value: "{actual}": {field} in body must be of type {expected}: "{actual}"')

    @classmethod
    def not_supported(cls, field: str, value: Any, allowed: Iterable[Any]) -> FieldError:
        values = ", ".join(_value_repr(v) for v in allowed)
        return cls(field, "FieldValueNotSupported",
                   f"Unsupported value: {_value_repr(value)}: supported values: {values}")

    @classmethod
    def required(cls, field: str, message: str = "") -> FieldError:
        return cls(field, "FieldValueRequired", "Required value" + (f": {message}" if message else ""))

    @classmethod
    def forbidden(cls, field: str, message: str) -> FieldError:
        return cls(field, "FieldValueForbidden", f"Forbidden: {message}")

    @classmethod
    def duplicate(cls, field: str, value: Any) -> FieldError:
        return cls(field, "FieldValueDuplicate", f"Duplicate value: {_value_repr(value)}")

    @classmethod
    def too_long(cls, field: str, limit: int) -> FieldError:
        return cls(field, "FieldValueTooLong", f"Too long: may not be longer than {limit}")

    @classmethod
    def too_many(cls, field: str, actual: int, limit: int) -> FieldError:
        return cls(field, "FieldValueTooMany", f"Too many: {actual}: must have at most {limit} items")


# ------------------------------------------------------------------------------------------------
# CEL (x-kubernetes-validations) with cel-python
# ------------------------------------------------------------------------------------------------

def _numeric_widening(op: str) -> Callable[[Any, Any], Any]:
    original = base_functions[op]

    def compare(a: Any, b: Any) -> Any:
        if isinstance(a, ct.IntType | ct.UintType) and isinstance(b, ct.DoubleType):
            a = ct.DoubleType(a)
        elif isinstance(b, ct.IntType | ct.UintType) and isinstance(a, ct.DoubleType):
            b = ct.DoubleType(b)
        return original(a, b)

    return compare


def _cel_index_of(container: Any, item: Any, start: Any = 0) -> ct.IntType:
    if isinstance(container, str):
        return ct.IntType(container.find(item, int(start)))
    for index, element in enumerate(container):
        if index >= int(start) and element == item:
            return ct.IntType(index)
    return ct.IntType(-1)


def _cel_last_index_of(container: Any, item: Any, end: Any = None) -> ct.IntType:
    if isinstance(container, str):
        return ct.IntType(container.rfind(item, 0, None if end is None else int(end) + len(item)))
    for index in range(len(container) - 1, -1, -1):
        if container[index] == item:
            return ct.IntType(index)
    return ct.IntType(-1)


def _cel_split(text: Any, sep: Any, limit: Any = -1) -> ct.ListType:
    limit = int(limit)
    if limit == 0:
        return ct.ListType([])
    parts = text.split(sep, limit - 1) if limit > 0 else text.split(sep)
    return ct.ListType([ct.StringType(p) for p in parts])


def _cel_substring(text: Any, start: Any, end: Any = None) -> ct.StringType:
    return ct.StringType(text[int(start):] if end is None else text[int(start):int(end)])


def _cel_replace(text: Any, old: Any, new: Any, limit: Any = -1) -> ct.StringType:
    return ct.StringType(text.replace(old, new, int(limit)))


def _cel_sum(items: Any) -> Any:
    total: Any = ct.IntType(0)
    for item in items:
        total = ct.DoubleType(total + item) if isinstance(item, ct.DoubleType) else type(item)(total + item)
    return total


CEL_FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{op: _numeric_widening(op) for op in ("_<_", "_<=_", "_>_", "_>=_", "_==_", "_!=_")},
    "charAt": lambda s, i: ct.StringType(s[int(i)] if int(i) < len(s) else ""),
    "indexOf": _cel_index_of,
    "lastIndexOf": _cel_last_index_of,
    "lowerAscii": lambda s: ct.StringType(s.lower()),
    "upperAscii": lambda s: ct.StringType(s.upper()),
    "trim": lambda s: ct.StringType(s.strip()),
    "split": _cel_split,
    "substring": _cel_substring,
    "replace": _cel_replace,
    "reverse": lambda s: ct.StringType(s[::-1]),
    "join": lambda items, sep="": ct.StringType(sep.join(items)),
    "find": lambda s, rx: ct.StringType(m.group(0) if (m := re.search(rx, s)) else ""),
    "findAll": lambda s, rx, n=-1: ct.ListType(
        [ct.StringType(m.group(0)) for m in re.finditer(rx, s)][: None if int(n) < 0 else int(n)]),
    "isSorted": lambda items: ct.BoolType(all(a <= b for a, b in zip(items, items[1:], strict=False))),
    "sum": _cel_sum,
    "min": lambda items: min(items),
    "max": lambda items: max(items),
}


class CelRule:
    """A compiled ``x-kubernetes-validations`` rule (cached by expression text)."""

    _env = celpy.Environment()
    _cache: dict[str, tuple[Any, str | None]] = {}
    _cache_lock = threading.Lock()

    @classmethod
    def program(cls, expression: str) -> tuple[Any, str | None]:
        with cls._cache_lock:
            if expression not in cls._cache:
                try:
                    program = cls._env.program(cls._env.compile(expression), functions=CEL_FUNCTIONS)
                    cls._cache[expression] = (program, None)
                except Exception as exc:  # cel-python cannot parse some newer syntax (e.g. `.?` optionals)
                    logger.warning("CEL rule cannot be compiled and is skipped: %r: %s", expression, exc)
                    cls._cache[expression] = (None, f"{type(exc).__name__}: {exc}")
            return cls._cache[expression]

    @classmethod
    def evaluate(cls, expression: str, activation: dict[str, Any]) -> Any:
        program, error = cls.program(expression)
        if program is None:
            raise RuntimeError(f"uncompilable CEL: {error}")
        return program.evaluate(activation)


def to_cel(value: Any, schema: Mapping[str, Any] | None) -> Any:
    """Convert a JSON value to CEL types, guided by the schema (numbers vs integers, date-times)."""
    schema = schema or {}
    if value is None:
        return None
    if isinstance(value, bool):
        return ct.BoolType(value)
    kind = schema.get("type")
    if isinstance(value, int):
        return ct.DoubleType(value) if kind == "number" else ct.IntType(value)
    if isinstance(value, float):
        return ct.IntType(int(value)) if kind == "integer" and value.is_integer() else ct.DoubleType(value)
    if isinstance(value, str):
        with contextlib.suppress(Exception):
            if schema.get("format") == "date-time":
                return ct.TimestampType(value)
            if schema.get("format") == "duration":
                return ct.DurationType(value)
        return ct.StringType(value)
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else None
        return ct.ListType([to_cel(item, items) for item in value])
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
        return ct.MapType({ct.StringType(k): to_cel(v, props.get(k) or extra) for k, v in value.items()})
    return celpy.json_to_cel(value)


# ------------------------------------------------------------------------------------------------
# Structural schemas: pruning, defaulting, OpenAPI validation (jsonschema), list types, CEL
# ------------------------------------------------------------------------------------------------

_FORMAT_CHECKER = jsonschema.FormatChecker(formats=())


@_FORMAT_CHECKER.checks("date-time", raises=ValueError)
def _check_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", value):
        return False
    datetime.datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
    return True


@_FORMAT_CHECKER.checks("byte", raises=ValueError)
def _check_byte(value: object) -> bool:
    if isinstance(value, str):
        base64.b64decode(value, validate=True)
    return True


@_FORMAT_CHECKER.checks("uuid", raises=ValueError)
def _check_uuid(value: object) -> bool:
    if isinstance(value, str):
        uuid.UUID(value)
    return True


@_FORMAT_CHECKER.checks("ipv4", raises=ValueError)
def _check_ipv4(value: object) -> bool:
    if isinstance(value, str):
        ipaddress.IPv4Address(value)
    return True


@_FORMAT_CHECKER.checks("ipv6", raises=ValueError)
def _check_ipv6(value: object) -> bool:
    if isinstance(value, str):
        ipaddress.IPv6Address(value)
    return True


def openapi_to_jsonschema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Convert a Kubernetes OpenAPI v3 (structural) schema into a draft-4 JSON schema."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "definitions") and isinstance(value, dict):
            out[key] = {name: openapi_to_jsonschema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = openapi_to_jsonschema(value)
        elif key in ("allOf", "anyOf", "oneOf") and isinstance(value, list):
            out[key] = [openapi_to_jsonschema(sub) for sub in value]
        elif key.startswith("x-") or key in ("default", "description", "example", "externalDocs", "nullable",
                                               "title", "discriminator", "readOnly", "writeOnly", "deprecated"):
            continue
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        out["_k8sIntOrString"] = True
    if schema.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        for key in ("anyOf", "oneOf"):
            if key in out:
                out[key] = [*out[key], {"type": "null"}]
    return out


class StructuralSchema:
    """The openAPIV3Schema of one served CRD version, with the API server's write-path behaviour."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema
        self._validator: jsonschema.protocols.Validator | None = None
        self._lock = threading.Lock()

    @property
    def validator(self) -> jsonschema.protocols.Validator:
        with self._lock:
            if self._validator is None:
                self._validator = jsonschema.Draft4Validator(openapi_to_jsonschema(self.schema),
                                                             format_checker=_FORMAT_CHECKER)
            return self._validator

    # --- pruning ---------------------------------------------------------------------------------

    def prune(self, obj: dict[str, Any]) -> list[str]:
        """Drop unknown fields in place; return their paths."""
        pruned: list[str] = []
        self._prune(obj, self.schema, [], pruned, root=True)
        return pruned

    def _prune(self, value: Any, schema: Mapping[str, Any] | None, path: list[str | int], pruned: list[str],
               root: bool = False) -> None:
        if not schema:
            return
        if isinstance(value, dict):
            if schema.get("x-kubernetes-int-or-string"):
                return
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties")
            keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields", False) or extra is True
            object_meta = root or schema.get("x-kubernetes-embedded-resource", False)
            for key in list(value):
                if object_meta and key in ("apiVersion", "kind", "metadata"):
                    continue  # ObjectMeta and type meta are never pruned by the CRD schema
                if key in props:
                    self._prune(value[key], props[key], [*path, key], pruned)
                elif isinstance(extra, dict):
                    self._prune(value[key], extra, [*path, key], pruned)
                elif not keep_unknown:
                    del value[key]
                    pruned.append(self.format_path([*path, key]))
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for index, item in enumerate(value):
                self._prune(item, schema["items"], [*path, index], pruned)

    # --- defaulting ------------------------------------------------------------------------------

    def default(self, obj: dict[str, Any]) -> None:
        """Apply structural defaults in place (and drop non-nullable nulls without defaults)."""
        self._default(obj, self.schema, root=True)

    def _default(self, value: Any, schema: Mapping[str, Any] | None, root: bool = False) -> None:
        if not schema:
            return
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            for key, sub in props.items():
                if root and key == "metadata":
                    continue
                if key in value and value[key] is None and not sub.get("nullable"):
                    if "default" in sub:
                        value[key] = copy.deepcopy(sub["default"])
                    else:
                        del value[key]
                elif key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
            extra = schema.get("additionalProperties")
            for key, sub_value in value.items():
                if root and key == "metadata":
                    continue
                if key in props:
                    self._default(sub_value, props[key])
                elif isinstance(extra, dict):
                    self._default(sub_value, extra)
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for item in value:
                self._default(item, schema["items"])

    # --- validation ------------------------------------------------------------------------------

    def format_path(self, parts: Iterable[str | int]) -> str:
        """Format a path like the API server: ``spec.items[0].name``, map keys as ``labels[key]``."""
        out, node = "", self.schema
        for part in parts:
            if isinstance(part, int):
                out += f"[{part}]"
                node = node.get("items") if isinstance(node, Mapping) and isinstance(node.get("items"), dict) else None
                continue
            props = (node or {}).get("properties") or {}
            extra = (node or {}).get("additionalProperties")
            if part not in props and isinstance(extra, dict):
                out += f"[{part}]"
                node = extra
            else:
                out += ("." if out else "") + part
                node = props.get(part)
        return out

    def validate(self, obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[FieldError]:
        errors = self._openapi_errors(obj)
        self._list_type_errors(obj, self.schema, [], errors)
        if not errors:
            self._cel_errors(obj, old, self.schema, [], errors, has_old=old is not None)
        return errors

    def _openapi_errors(self, obj: Mapping[str, Any]) -> list[FieldError]:
        errors: list[FieldError] = []
        seen: set[str] = set()
        for err in sorted(self.validator.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path]):
            path = list(err.absolute_path)
            if path and path[0] == "metadata":
                continue  # ObjectMeta is validated separately
            for error in self._map_error(err, path):
                if str(error) not in seen:
                    seen.add(str(error))
                    errors.append(error)
        return errors

    def _map_error(self, err: jsonschema.ValidationError, path: list[Any]) -> list[FieldError]:
        keyword, expected, value = err.validator, err.validator_value, err.instance
        field = self.format_path(path)
        if keyword == "required":
            present = value if isinstance(value, dict) else {}
            return [FieldError.required(self.format_path([*path, name])) for name in expected if name not in present]
        if keyword == "type":
            types = [t for t in (expected if isinstance(expected, list) else [expected]) if t != "null"]
            return [FieldError.type_invalid(field, value, " or ".join(types))]
        if keyword == "enum":
            return [FieldError.not_supported(field, value, [v for v in expected if v is not None])]
        if keyword == "minimum":
            op = "greater than" if err.schema.get("exclusiveMinimum") is True else "greater than or equal to"
            return [FieldError.invalid(field, value, f"{field} in body should be {op} {_value_repr(expected)}")]
        if keyword == "maximum":
            op = "less than" if err.schema.get("exclusiveMaximum") is True else "less than or equal to"
            return [FieldError.invalid(field, value, f"{field} in body should be {op} {_value_repr(expected)}")]
        if keyword == "multipleOf":
            return [FieldError.invalid(field, value,
                                       f"{field} in body should be a multiple of {_value_repr(expected)}")]
        if keyword == "pattern":
            return [FieldError.invalid(field, value, f"{field} in body should match '{expected}'")]
        if keyword == "minLength":
            return [FieldError.invalid(field, value, f"{field} in body should be at least {expected} chars long")]
        if keyword == "maxLength":
            return [FieldError.too_long(field, expected)]
        if keyword == "minItems":
            return [FieldError.invalid(field, len(value), f"{field} in body should have at least {expected} items")]
        if keyword == "maxItems":
            return [FieldError.too_many(field, len(value), expected)]
        if keyword == "minProperties":
            return [FieldError.invalid(field, len(value),
                                       f"{field} in body should have at least {expected} properties")]
        if keyword == "maxProperties":
            return [FieldError.too_many(field, len(value), expected)]
        if keyword == "format":
            return [FieldError.invalid(field, value,
                                       f"{field} in body must be of type {expected}: {_value_repr(value)}")]
        if keyword == "uniqueItems":
            return [FieldError.duplicate(field, value)]
        if keyword == "anyOf" and err.schema.get("_k8sIntOrString"):
            return [FieldError.type_invalid(field, value, "integer or string")]
        if keyword in ("anyOf", "oneOf", "allOf", "not"):
            causes = "; ".join(sorted({sub.message for sub in err.context or []}))
            suffix = f": {causes}" if causes else ""
            return [FieldError.invalid(field, value, f"{field} in body must validate {keyword}{suffix}")]
        return [FieldError.invalid(field, value, err.message)]

    def _list_type_errors(self, value: Any, schema: Mapping[str, Any] | None, path: list[str | int],
                          errors: list[FieldError]) -> None:
        if not schema:
            return
        if isinstance(value, list):
            items = schema.get("items") if isinstance(schema.get("items"), dict) else None
            list_type = schema.get("x-kubernetes-list-type")
            seen: set[str] = set()
            for index, item in enumerate(value):
                if list_type == "set":
                    key = _canonical(item)
                    if key in seen:
                        errors.append(FieldError.duplicate(self.format_path([*path, index]), item))
                    seen.add(key)
                elif list_type == "map" and isinstance(item, dict):
                    keys = {k: item.get(k) for k in schema.get("x-kubernetes-list-map-keys") or []}
                    if _canonical(keys) in seen:
                        errors.append(FieldError.duplicate(self.format_path([*path, index]), keys))
                    seen.add(_canonical(keys))
                self._list_type_errors(item, items, [*path, index], errors)
        elif isinstance(value, dict):
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
            for key, sub in value.items():
                if not path and key == "metadata":
                    continue
                self._list_type_errors(sub, props.get(key) or extra, [*path, key], errors)

    def _cel_errors(self, new: Any, old: Any, schema: Mapping[str, Any] | None, path: list[str | int],
                    errors: list[FieldError], has_old: bool) -> None:
        if not schema or new is None:
            return
        for rule in schema.get("x-kubernetes-validations") or []:
            self._cel_rule(rule, new, old, schema, path, errors, has_old)
        if isinstance(new, dict) and not schema.get("x-kubernetes-int-or-string"):
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
            for key, sub in new.items():
                if not path and key == "metadata":
                    continue
                sub_schema = props.get(key) or extra
                old_has = has_old and isinstance(old, dict) and key in old
                self._cel_errors(sub, old.get(key) if old_has else None, sub_schema, [*path, key], errors, old_has)
        elif isinstance(new, list) and isinstance(schema.get("items"), dict):
            list_type = schema.get("x-kubernetes-list-type")
            map_keys = schema.get("x-kubernetes-list-map-keys") or []

            def correlation_key(item: Any) -> str | None:
                if list_type == "map" and isinstance(item, dict):
                    return _canonical({k: item.get(k) for k in map_keys})
                if list_type == "set":
                    return _canonical(item)
                return None  # atomic lists are not correlatable: no transition rules inside

            olds = {correlation_key(o): o for o in old} if has_old and isinstance(old, list) else {}
            olds.pop(None, None)
            for index, item in enumerate(new):
                key = correlation_key(item)
                self._cel_errors(item, olds.get(key), schema["items"], [*path, index], errors,
                                 key is not None and key in olds)

    def _cel_rule(self, rule: Mapping[str, Any], new: Any, old: Any, schema: Mapping[str, Any],
                  path: list[str | int], errors: list[FieldError], has_old: bool) -> None:
        expression = rule.get("rule", "")
        transition = bool(_OLDSELF_RE.search(expression))
        if transition and not has_old:
            return  # transition rules apply to updates of existing values only (optionalOldSelf unsupported)
        if CelRule.program(expression)[0] is None:
            return  # uncompilable with cel-python: skipped (logged once)
        activation = {"self": to_cel(new, schema)}
        if transition:
            activation["oldSelf"] = to_cel(old, schema)
        field = self.format_path(path)
        if rule.get("fieldPath"):
            field = f"{field}{rule['fieldPath']}" if field else rule["fieldPath"].lstrip(".")
        type_name = schema.get("type") or _type_name(new)
        try:
            result = CelRule.evaluate(expression, activation)
        except Exception as exc:
            result = exc
        if isinstance(result, CELEvalError | Exception):
            errors.append(FieldError(field, "FieldValueInvalid",
                                     f'Invalid value: "{type_name}": {result.args[0] if result.args else result} '
                                     f"evaluating rule: {expression}"))
            return
        if result is True or (isinstance(result, ct.BoolType) and bool(result)):
            return
        message = rule.get("message") or f"failed rule: {expression}"
        if rule.get("messageExpression"):
            with contextlib.suppress(Exception):
                computed = CelRule.evaluate(rule["messageExpression"], activation)
                if isinstance(computed, str) and computed.strip():
                    message = str(computed)
        reason = rule.get("reason") or "FieldValueInvalid"
        if reason == "FieldValueForbidden":
            errors.append(FieldError.forbidden(field, message))
        elif reason == "FieldValueRequired":
            errors.append(FieldError.required(field, message))
        elif reason == "FieldValueDuplicate":
            errors.append(FieldError(field, reason, f"Duplicate value: {message}"))
        else:
            errors.append(FieldError(field, "FieldValueInvalid", f'Invalid value: "{type_name}": {message}'))


# ------------------------------------------------------------------------------------------------
# Resources and CRDs
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class ResourceDef:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    shortnames: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    verbs: tuple[str, ...] = CUSTOM_VERBS
    custom: bool = False
    schema: StructuralSchema | None = None
    crd_name: str | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def gkey(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def tracks_generation(self) -> bool:
        return self.custom or (self.has_status and self.group != "")

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


class Registry:
    """All served resources by (group, version, plural); thread-safe (read from the test thread)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._resources: dict[tuple[str, str, str], ResourceDef] = {}

    def add(self, rdef: ResourceDef) -> None:
        with self._lock:
            self._resources[(rdef.group, rdef.version, rdef.plural)] = rdef

    def replace_crd(self, crd_name: str, rdefs: Iterable[ResourceDef]) -> None:
        with self._lock:
            self.remove_crd(crd_name)
            for rdef in rdefs:
                self.add(rdef)

    def remove_crd(self, crd_name: str) -> list[ResourceDef]:
        with self._lock:
            removed = [r for r in self._resources.values() if r.crd_name == crd_name]
            for rdef in removed:
                del self._resources[(rdef.group, rdef.version, rdef.plural)]
            return removed

    def all(self) -> list[ResourceDef]:
        with self._lock:
            return list(self._resources.values())

    def get(self, group: str, version: str, plural: str) -> ResourceDef | None:
        with self._lock:
            return self._resources.get((group, version, plural))

    def versions(self, group: str) -> list[str]:
        with self._lock:
            return sorted({r.version for r in self._resources.values() if r.group == group}, key=_kube_version_key)

    def groups(self) -> list[str]:
        with self._lock:
            return sorted({r.group for r in self._resources.values() if r.group})

    def preferred(self, group: str, plural: str) -> ResourceDef | None:
        with self._lock:
            candidates = [r for r in self._resources.values() if r.group == group and r.plural == plural]
        return min(candidates, key=lambda r: _kube_version_key(r.version)) if candidates else None

    def by_kind(self, api_version: str, kind: str) -> ResourceDef | None:
        group, _, version = api_version.rpartition("/")
        with self._lock:
            for rdef in self._resources.values():
                if rdef.group == group and rdef.version == version and rdef.kind == kind:
                    return rdef
        return None

    def resolve(self, ref: str | ResourceDef) -> ResourceDef:
        """Find a resource by ``group/version/plural``, ``v1/plural``, ``plural.group``, plural, kind,
        singular or short name (custom resources first, then the core group, then other groups)."""
        if isinstance(ref, ResourceDef):
            return ref
        parts = ref.split("/")
        if len(parts) == 3:
            rdef = self.get(*parts)
        elif len(parts) == 2:
            rdef = self.get("", parts[0], parts[1])
        else:
            name, _, group = ref.partition(".")
            with self._lock:
                candidates = [r for r in self._resources.values()
                              if (not group or r.group == group)
                              and name.lower() in {r.plural, r.singular, r.kind.lower(), *r.shortnames}]
            candidates.sort(key=lambda r: (not r.custom, r.group != "", r.group, _kube_version_key(r.version)))
            rdef = candidates[0] if candidates else None
        if rdef is None:
            raise KeyError(f"unknown resource: {ref!r}")
        return rdef


_YAML_CACHE: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
_SCHEMA_CACHE: dict[int, tuple[Mapping[str, Any], StructuralSchema]] = {}
_CACHE_LOCK = threading.Lock()


def load_crd_documents(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All CustomResourceDefinition documents of a YAML file (cached by path+mtime; do not mutate)."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    with _CACHE_LOCK:
        if key not in _YAML_CACHE:
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            docs: list[dict[str, Any]] = []
            with path.open(encoding="utf-8") as f:
                for doc in yaml.load_all(f, Loader=loader):
                    if isinstance(doc, dict) and doc.get("kind") == "List":
                        docs.extend(d for d in doc.get("items") or [] if isinstance(d, dict))
                    elif isinstance(doc, dict):
                        docs.append(doc)
            _YAML_CACHE[key] = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
        return _YAML_CACHE[key]


def crd_files(directory: str | os.PathLike[str]) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def _structural_schema(schema: Mapping[str, Any]) -> StructuralSchema:
    with _CACHE_LOCK:
        cached = _SCHEMA_CACHE.get(id(schema))
        if cached is None or cached[0] is not schema:
            cached = _SCHEMA_CACHE[id(schema)] = (schema, StructuralSchema(schema))
        return cached[1]


def crd_resources(crd: Mapping[str, Any]) -> list[ResourceDef]:
    """The served resources of a CRD; raises ValueError with field errors if the CRD is unusable."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    problems = []
    if not group:
        problems.append(FieldError.required("spec.group"))
    if not plural:
        problems.append(FieldError.required("spec.names.plural"))
    if not kind:
        problems.append(FieldError.required("spec.names.kind"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        problems.append(FieldError.not_supported("spec.scope", spec.get("scope"), ["Cluster", "Namespaced"]))
    versions = spec.get("versions") or []
    if not versions:
        problems.append(FieldError.required("spec.versions"))
    if sum(1 for v in versions if v.get("storage")) != 1 and versions:
        problems.append(FieldError.invalid("spec.versions", len(versions),
                                           "must have exactly one version marked as storage version"))
    name = (crd.get("metadata") or {}).get("name")
    if plural and group and name != f"{plural}.{group}":
        problems.append(FieldError.invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    if problems:
        raise ValueError(problems)
    result = []
    for version in versions:
        if not version.get("served", True):
            continue
        schema = ((version.get("schema") or {}).get("openAPIV3Schema")
                  or (spec.get("validation") or {}).get("openAPIV3Schema")
                  or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
        subresources = version.get("subresources") or spec.get("subresources") or {}
        result.append(ResourceDef(
            group=group, version=version["name"], plural=plural, kind=kind,
            namespaced=spec["scope"] == "Namespaced", singular=names.get("singular") or kind.lower(),
            shortnames=tuple(names.get("shortNames") or ()), categories=tuple(names.get("categories") or ()),
            subresources=frozenset(k for k in ("status", "scale") if k in subresources),
            custom=True, schema=_structural_schema(schema), crd_name=name,
        ))
    return result


def _peering_crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "scope": scope,
            "group": "kopf.dev",
            "names": {"kind": kind, "plural": plural, "singular": plural[:-1]},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }},
            }],
        },
    }


KOPF_PEERING_CRDS = [
    _peering_crd("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
    _peering_crd("KopfPeering", "kopfpeerings", "Namespaced"),
]

_MINIMAL_BUILTINS = [
    ResourceDef("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",), (), frozenset({"status"})),
    ResourceDef("", "v1", "events", "Event", True, "event", ("ev",)),
    ResourceDef("", "v1", "secrets", "Secret", True, "secret"),
    ResourceDef("", "v1", "configmaps", "ConfigMap", True, "configmap", ("cm",)),
    ResourceDef("", "v1", "services", "Service", True, "service", ("svc",), (), frozenset({"status"})),
    ResourceDef("", "v1", "pods", "Pod", True, "pod", ("po",), (), frozenset({"status"})),
    ResourceDef("", "v1", "serviceaccounts", "ServiceAccount", True, "serviceaccount", ("sa",)),
    ResourceDef("apps", "v1", "deployments", "Deployment", True, "deployment", ("deploy",), (),
                frozenset({"status", "scale"})),
    ResourceDef("apps", "v1", "statefulsets", "StatefulSet", True, "statefulset", ("sts",), (),
                frozenset({"status", "scale"})),
    ResourceDef("batch", "v1", "jobs", "Job", True, "job", (), (), frozenset({"status"})),
    ResourceDef("coordination.k8s.io", "v1", "leases", "Lease", True, "lease"),
    ResourceDef("events.k8s.io", "v1", "events", "Event", True, "event", ("ev",)),
]
_CRD_RESOURCE = ResourceDef("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                            False, "customresourcedefinition", ("crd", "crds"), ("api-extensions",),
                            frozenset({"status"}))


def builtin_resources() -> list[ResourceDef]:
    """Built-in resources from kmock's bundled discovery data (minus add-on groups)."""
    result = {(r.group, r.version, r.plural): r for r in _MINIMAL_BUILTINS}
    try:
        bundled = k8s_views.ResourcesArray()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # kmock uses importlib.resources.read_binary
            bundled.load_bundled()
    except Exception as exc:  # pragma: no cover - depends on the kmock packaging
        logger.warning("kmock's bundled resources are unavailable (%s); using a minimal list", exc)
    else:
        for res in bundled:
            info = bundled[res]
            if res.group in EXCLUDED_BUILTIN_GROUPS or not res.plural or info.kind is None:
                continue
            result[(res.group, res.version, res.plural)] = ResourceDef(
                group=res.group, version=res.version, plural=res.plural, kind=info.kind,
                namespaced=bool(info.namespaced), singular=info.singular or info.kind.lower(),
                shortnames=tuple(sorted(info.shortnames)), categories=tuple(sorted(info.categories)),
                subresources=frozenset(info.subresources), verbs=tuple(sorted(info.verbs)) or CUSTOM_VERBS)
    result[("apiextensions.k8s.io", "v1", "customresourcedefinitions")] = _CRD_RESOURCE
    return list(result.values())


# ------------------------------------------------------------------------------------------------
# The emulator (runs inside an asyncio loop; see K8sApi for the threaded server + sync client)
# ------------------------------------------------------------------------------------------------

def _status_error(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details)


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    rv: int
    gkey: tuple[str, str]
    type: str
    obj: dict[str, Any]
    prev: dict[str, Any] | None = None


_STOP = object()


def parse_k8s_path(path: str) -> dict[str, Any] | None:
    """Parse ``/api/v1/...`` and ``/apis/{group}/{version}/...`` paths (kmock's parser cannot do
    ``/api/v1/namespaces`` or ``/api/v1/namespaces/{name}``)."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        return None
    return {"group": group, "version": version, "plural": rest[0] if rest else None, "namespace": namespace,
            "name": rest[1] if len(rest) > 1 else None, "subresource": rest[2] if len(rest) > 2 else None}


@attrs.define(kw_only=True)
class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator with the API-server semantics kopf needs (see the module docstring)."""

    auto_namespaces: bool = True
    bookmark_interval: float = 30.0
    max_watch_log: int = 200_000
    registry: Registry = attrs.field(factory=Registry)
    _store: dict[tuple[str, str], dict[tuple[str | None, str], dict[str, Any]]] = attrs.field(factory=dict, init=False)
    _uids: dict[str, tuple[tuple[str, str], tuple[str | None, str]]] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=0, init=False)
    _log: list[WatchEvent] = attrs.field(factory=list, init=False)
    _log_floor: int = attrs.field(default=0, init=False)
    _watchers: set[asyncio.Queue[Any]] = attrs.field(factory=set, init=False)
    _active_watches: dict[int, tuple[str, str, str, str | None]] = attrs.field(factory=dict, init=False)
    _stopping: bool = attrs.field(default=False, init=False)
    #: every request served, oldest first (``request_log``). kmock's own log (``_requests``) holds only
    #: the requests in flight: kmock matches each request by scanning its log (``request in view``),
    #: so a log of every request made each request slower than the last (quadratic: an operator
    #: module's tens of thousands of requests left the emulator's thread at 100 % CPU, and kopf's
    #: retries waited a minute)
    history: list[rendering.Request] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for rdef in builtin_resources():
            self._register(rdef)

    # --- registry --------------------------------------------------------------------------------

    def _register(self, rdef: ResourceDef) -> None:
        self.registry.add(rdef)
        self.resources[f"{rdef.group}/{rdef.version}/{rdef.plural}" if rdef.group else f"v1/{rdef.plural}"] = \
            kmock.ResourceInfo(namespaced=rdef.namespaced, kind=rdef.kind, singular=rdef.singular,
                               verbs=set(rdef.verbs), shortnames=set(rdef.shortnames),
                               categories=set(rdef.categories), subresources=set(rdef.subresources))

    def install_crd(self, crd: Mapping[str, Any]) -> dict[str, Any]:
        """Create (or replace) a CRD from within the emulator's loop thread (used at startup)."""
        crd_def = self.registry.resolve("apiextensions.k8s.io/v1/customresourcedefinitions")
        name = (crd.get("metadata") or {}).get("name")
        existing = self._store.get(crd_def.gkey, {}).get((None, name))
        if existing is not None:
            candidate = {**copy.deepcopy(dict(crd)), "metadata": {**copy.deepcopy(crd.get("metadata") or {}),
                                                                   "resourceVersion": None}}
            return self._update(crd_def, existing, candidate, None, {})
        return self._create(crd_def, None, crd, {})

    # --- HTTP plumbing ---------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Like kmock's RawHandler.__call__, but with our own request parsing (see parse_k8s_path)."""
        await raw_request.read()
        raw_response: aiohttp.web.StreamResponse | None = None
        try:
            request = await self._parse_request(raw_request)
            self.history.append(request)
            self._requests.append(request)
            try:
                return await self._handle(request)
            except rendering.StreamingError as e:
                raw_response = e.args[0]
                if e.__cause__ is not None:
                    raise e.__cause__ from None
                raise
            finally:
                self._requests[:] = [r for r in self._requests if r is not request]
        except Exception as e:
            if not isinstance(e, kmock.KubernetesError):
                logger.exception("Unexpected emulator error for %s %s", raw_request.method, raw_request.path_qs)
                if self._errors:
                    self._errors[-1].append(e)
            if raw_response is None or not raw_response.prepared:
                return await self._render_error(e)
            await self._stream_error(e, raw_response)
            await raw_response.write_eof()
            return raw_response

    async def _parse_request(self, raw: aiohttp.web.BaseRequest) -> rendering.Request:
        body = await raw.read()
        text = body.decode("utf-8", errors="replace")
        data: Any = None
        if body:
            try:
                data = json.loads(body)
            except ValueError:
                with contextlib.suppress(yaml.YAMLError):
                    data = yaml.safe_load(text)
        parsed = parse_k8s_path(raw.path)
        action = resource = None
        if parsed is not None:
            resource = kmock.resource(group=parsed["group"], version=parsed["version"], plural=parsed["plural"])
            if parsed["plural"] is not None:
                method = raw.method.upper()
                if method == "GET":
                    action = enums.action.WATCH if raw.query.get("watch") in ("true", "1") else (
                        enums.action.FETCH if parsed["name"] else enums.action.LIST)
                elif method == "POST":
                    action = enums.action.CREATE
                elif method in ("PUT", "PATCH"):
                    action = enums.action.UPDATE
                elif method == "DELETE":
                    action = enums.action.DELETE
        return rendering.Request(
            id=len(self.history), raw_request=raw, url=raw.url, method=raw.method, params=dict(raw.query),
            headers=dict(raw.headers), cookies=dict(raw.cookies), body=body, text=text, data=data,
            action=action, resource=resource,
            namespace=parsed["namespace"] if parsed else None, name=parsed["name"] if parsed else None,
            subresource=parsed["subresource"] if parsed else None,
        )

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        # Skip KubernetesEmulator._handle (its naive dict-merging object store): state lives here.
        return await kmock.RawHandler._handle(self, request)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, kmock.KubernetesError):
            body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                    "message": exc.message or "", "reason": exc.reason or "", "code": exc.status}
            if exc.details is not None:
                body["details"] = exc.details
            return aiohttp.web.json_response(body, status=exc.status)
        return await super()._render_error(exc)

    # Every Kubernetes action of kmock's fallback routing lands in one dispatcher.
    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        return self._dispatch(request)

    async def _serve_watch(self, request: rendering.Request) -> rendering.Payload:  # type: ignore[override]
        return self._dispatch(request)

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        return self._dispatch(request)

    async def _serve_create(self, request: rendering.Request) -> rendering.Payload:
        return self._dispatch(request)

    async def _serve_update(self, request: rendering.Request) -> rendering.Payload:
        return self._dispatch(request)

    async def _serve_delete(self, request: rendering.Request) -> rendering.Payload:
        return self._dispatch(request)

    # --- discovery -------------------------------------------------------------------------------

    async def _serve_root(self, request: rendering.Request) -> rendering.Payload:
        paths = {"/api", "/api/v1", "/apis", "/version"}
        for group in self.registry.groups():
            paths.add(f"/apis/{group}")
            paths.update(f"/apis/{group}/{v}" for v in self.registry.versions(group))
        return {"paths": sorted(paths)}

    async def _serve_api(self, request: rendering.Request) -> rendering.Payload:
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}

    def _api_group(self, group: str) -> dict[str, Any]:
        versions = self.registry.versions(group)
        return {"name": group,
                "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]}}

    async def _serve_apis(self, request: rendering.Request) -> rendering.Payload:
        return {"kind": "APIGroupList", "apiVersion": "v1",
                "groups": [self._api_group(group) for group in self.registry.groups()]}

    async def _serve_group(self, request: rendering.Request) -> rendering.Payload:
        group = request.url.path.strip("/").split("/")[1]
        if not self.registry.versions(group):
            raise self._no_such_path()
        return {"kind": "APIGroup", "apiVersion": "v1", **self._api_group(group)}

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        parts = request.url.path.strip("/").split("/")
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        rdefs = sorted((r for r in self.registry.all() if r.group == group and r.version == version),
                       key=lambda r: r.plural)
        if not rdefs:
            raise self._no_such_path()
        resources = []
        for rdef in rdefs:
            resources.append({"name": rdef.plural, "singularName": rdef.singular, "namespaced": rdef.namespaced,
                              "kind": rdef.kind, "verbs": list(rdef.verbs), "shortNames": list(rdef.shortnames),
                              "categories": list(rdef.categories)})
            for sub in sorted(rdef.subresources):
                resources.append({"name": f"{rdef.plural}/{sub}", "singularName": "", "namespaced": rdef.namespaced,
                                  "kind": "Scale" if sub == "scale" else rdef.kind, "verbs": list(SUBRESOURCE_VERBS)})
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}".lstrip("/"),
                "resources": resources}

    # --- errors ----------------------------------------------------------------------------------

    @staticmethod
    def _no_such_path() -> kmock.KubernetesError:
        return _status_error(404, "NotFound", "the server could not find the requested resource", {})

    @staticmethod
    def _not_found(rdef: ResourceDef, name: str) -> kmock.KubernetesError:
        return _status_error(404, "NotFound", f'{rdef.qualified} "{name}" not found',
                             {"name": name, "group": rdef.group, "kind": rdef.plural})

    @staticmethod
    def _bad_request(message: str) -> kmock.KubernetesError:
        return _status_error(400, "BadRequest", message)

    @staticmethod
    def _conflict(rdef: ResourceDef, name: str, message: str | None = None) -> kmock.KubernetesError:
        return _status_error(409, "Conflict", message or (
            f'Operation cannot be fulfilled on {rdef.qualified} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again"),
            {"name": name, "group": rdef.group, "kind": rdef.plural})

    @staticmethod
    def _invalid(rdef: ResourceDef, name: str, errors: list[FieldError]) -> kmock.KubernetesError:
        listing = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
        qualified_kind = f"{rdef.kind}.{rdef.group}" if rdef.group else rdef.kind
        return _status_error(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {listing}', {
            "name": name, "group": rdef.group, "kind": rdef.kind,
            "causes": [{"reason": e.reason, "message": e.detail, "field": e.field} for e in errors]})

    # --- request dispatching ---------------------------------------------------------------------

    def _dispatch(self, request: rendering.Request) -> rendering.Payload:
        parsed = parse_k8s_path(request.url.path)
        if parsed is None or parsed["plural"] is None:
            raise self._no_such_path()
        rdef = self.registry.get(parsed["group"], parsed["version"], parsed["plural"])
        if rdef is None:
            raise self._no_such_path()
        namespace, name, sub = parsed["namespace"], parsed["name"], parsed["subresource"]
        if namespace is not None and not rdef.namespaced:
            raise self._no_such_path()
        if sub is not None and sub not in rdef.subresources:
            raise self._no_such_path()
        method = str(getattr(request.method, "value", request.method)).upper()
        params = dict(request.params)
        if method == "GET" and params.get("watch") in ("true", "1"):
            return rendering.Response(status=200, headers={"Content-Type": "application/json"},
                                      payload=self._watch(request, rdef, namespace, name, params))
        if method == "GET":
            return self._get(rdef, namespace, name) if name else self._list(rdef, namespace, params)
        if name is None and method == "POST":
            if rdef.namespaced and namespace is None:
                raise self._no_such_path()
            return rendering.Response(status=201, payload=self._create(rdef, namespace, request.data, params))
        if name is None and method == "DELETE":
            return self._delete_collection(rdef, namespace, request.data, params)
        if name is not None and rdef.namespaced and namespace is None:
            raise self._no_such_path()
        if name is not None and method == "PUT":
            return self._replace(rdef, namespace, name, request.data, sub, params)
        if name is not None and method == "PATCH":
            content_type = request.headers.get("Content-Type", "application/merge-patch+json")
            return self._patch(rdef, namespace, name, request.data, content_type, sub, params)
        if name is not None and method == "DELETE":
            return self._delete(rdef, namespace, name, request.data, params)
        raise _status_error(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    # --- storage ---------------------------------------------------------------------------------

    def _bucket(self, rdef: ResourceDef) -> dict[tuple[str | None, str], dict[str, Any]]:
        return self._store.setdefault(rdef.gkey, {})

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _present(self, obj: dict[str, Any], rdef: ResourceDef) -> dict[str, Any]:
        if obj.get("apiVersion") == rdef.api_version:
            return obj
        return {**obj, "apiVersion": rdef.api_version}

    def _emit(self, rdef: ResourceDef, type_: str, obj: dict[str, Any], prev: dict[str, Any] | None = None) -> None:
        event = WatchEvent(int(obj["metadata"]["resourceVersion"]), rdef.gkey, type_, obj, prev)
        self._log.append(event)
        if len(self._log) > self.max_watch_log:
            dropped = self._log[: len(self._log) // 4]
            del self._log[: len(dropped)]
            self._log_floor = dropped[-1].rv
        for queue in self._watchers:
            queue.put_nowait(event)

    def _put(self, rdef: ResourceDef, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (meta.get("namespace") if rdef.namespaced else None, meta["name"])
        self._bucket(rdef)[key] = obj
        self._uids[meta["uid"]] = (rdef.gkey, key)

    # --- reads -----------------------------------------------------------------------------------

    def _get(self, rdef: ResourceDef, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self._bucket(rdef).get((namespace if rdef.namespaced else None, name))
        if obj is None:
            raise self._not_found(rdef, name)
        return self._present(obj, rdef)

    def _matcher(self, params: Mapping[str, str], name: str | None = None) -> Callable[[dict[str, Any]], bool]:
        try:
            labels = label_selector_matcher(params.get("labelSelector"))
            fields = field_selector_matcher(params.get("fieldSelector"))
        except ValueError as exc:
            raise self._bad_request(str(exc)) from None
        return lambda obj: ((name is None or obj["metadata"]["name"] == name)
                            and labels(obj["metadata"].get("labels") or {}) and fields(obj))

    def _list(self, rdef: ResourceDef, namespace: str | None, params: Mapping[str, str]) -> dict[str, Any]:
        matches = self._matcher(params)
        items = [obj for key, obj in sorted(self._bucket(rdef).items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))
                 if (namespace is None or key[0] == namespace) and matches(obj)]
        meta: dict[str, Any] = {"resourceVersion": str(self._rv)}
        if params.get("continue"):
            try:
                after = json.loads(base64.urlsafe_b64decode(params["continue"]))
            except ValueError:
                raise _status_error(410, "Expired", "the provided continue parameter is too old") from None
            items = [o for o in items if [o["metadata"].get("namespace") or "", o["metadata"]["name"]] > after]
        limit = int(params.get("limit") or 0)
        if 0 < limit < len(items):
            last = items[limit - 1]["metadata"]
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps([last.get("namespace") or "", last["name"]]).encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {"apiVersion": rdef.api_version, "kind": rdef.list_kind, "metadata": meta,
                "items": [self._present(obj, rdef) for obj in items]}

    # --- watching --------------------------------------------------------------------------------

    def active_watches(self) -> list[tuple[str, str, str, str | None]]:
        """(group, version, plural, namespace-or-None) of every open watch stream."""
        return list(self._active_watches.values())

    async def _watch(self, request: rendering.Request, rdef: ResourceDef, namespace: str | None,
                     name: str | None, params: Mapping[str, str]) -> Any:
        matches = self._matcher(params, name)
        since = params.get("resourceVersion") or ""
        initial = since in ("", "0") or params.get("sendInitialEvents") == "true"
        bookmarks = params.get("allowWatchBookmarks") == "true"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        queue: asyncio.Queue[Any] = asyncio.Queue()
        watch_id = id(queue)

        # Register and take the snapshot atomically (no await in between): no gaps, no duplicates.
        self._watchers.add(queue)
        self._active_watches[watch_id] = (rdef.group, rdef.version, rdef.plural, namespace)
        try:
            backlog: list[dict[str, Any]] = []
            if initial:
                for key, obj in sorted(self._bucket(rdef).items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
                    if (namespace is None or key[0] == namespace) and matches(obj):
                        backlog.append({"type": "ADDED", "object": self._present(obj, rdef)})
                if params.get("sendInitialEvents") == "true" and bookmarks:
                    backlog.append(self._bookmark(rdef, initial_end=True))
            else:
                try:
                    start = int(since)
                except ValueError:
                    raise self._bad_request(f"invalid resource version: {since!r}") from None
                if start < self._log_floor:
                    backlog.append({"type": "ERROR", "object": {
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": f"too old resource version: {start} ({self._log_floor})",
                        "reason": "Expired", "code": 410}})
                else:
                    for event in self._log:
                        if event.rv > start and (rendered := self._render_event(event, rdef, namespace, matches)):
                            backlog.append(rendered)

            yield b""  # send the headers now, even if there is nothing to stream yet
            for item in backlog:
                yield item
                if item["type"] == "ERROR":
                    return
            next_bookmark = loop.time() + self.bookmark_interval
            while not self._stopping:
                if deadline is not None and loop.time() >= deadline:
                    return  # timeoutSeconds: the client re-watches from the last seen resourceVersion
                timeout = min(1.0, next_bookmark - loop.time())
                if deadline is not None:
                    timeout = min(timeout, deadline - loop.time())
                try:
                    event = await asyncio.wait_for(queue.get(), max(timeout, 0.0))
                except TimeoutError:
                    event = None
                if event is _STOP:
                    return
                if event is not None:
                    if rendered := self._render_event(event, rdef, namespace, matches):
                        yield rendered
                    continue
                transport = request._raw_request.transport if request._raw_request is not None else None
                if transport is None or transport.is_closing():
                    return  # the client has gone away (aiohttp does not cancel handlers on disconnects)
                if bookmarks and loop.time() >= next_bookmark:
                    yield self._bookmark(rdef)
                    next_bookmark = loop.time() + self.bookmark_interval
                elif not bookmarks and loop.time() >= next_bookmark:
                    next_bookmark = loop.time() + self.bookmark_interval
        finally:
            self._watchers.discard(queue)
            self._active_watches.pop(watch_id, None)

    def _bookmark(self, rdef: ResourceDef, initial_end: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(self._rv)}
        if initial_end:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        return {"type": "BOOKMARK", "object": {"apiVersion": rdef.api_version, "kind": rdef.kind, "metadata": meta}}

    def _render_event(self, event: WatchEvent, rdef: ResourceDef, namespace: str | None,
                      matches: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        if event.gkey != rdef.gkey:
            return None
        if namespace is not None and event.obj["metadata"].get("namespace") != namespace:
            return None
        type_ = event.type
        now_matches = matches(event.obj)
        if type_ == "MODIFIED" and event.prev is not None:
            before = matches(event.prev)
            if not before and not now_matches:
                return None
            type_ = "MODIFIED" if before and now_matches else "ADDED" if now_matches else "DELETED"
        elif not now_matches:
            return None
        return {"type": type_, "object": self._present(event.obj, rdef)}

    # --- writes ----------------------------------------------------------------------------------

    def _check_type_meta(self, rdef: ResourceDef, obj: dict[str, Any]) -> None:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if api_version and api_version != rdef.api_version:
            raise self._bad_request(f"the API version in the data ({api_version}) does not match the expected "
                                    f"API version ({rdef.api_version})")
        if kind and kind != rdef.kind:
            raise self._bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rdef.kind})")
        obj["apiVersion"], obj["kind"] = rdef.api_version, rdef.kind
        if not isinstance(obj.get("metadata", {}), dict):
            raise self._bad_request("metadata must be an object")
        obj.setdefault("metadata", {})

    def _validate_meta(self, rdef: ResourceDef, obj: dict[str, Any]) -> list[FieldError]:
        errors: list[FieldError] = []
        meta = obj["metadata"]
        name = meta.get("name")
        if rdef.custom or rdef.plural == "namespaces":
            regex, limit = ((_DNS1123_LABEL_RE, 63) if rdef.plural == "namespaces" else (_DNS1123_SUBDOMAIN_RE, 253))
            if not isinstance(name, str) or not regex.match(name) or len(name) > limit:
                what = "RFC 1123 label" if rdef.plural == "namespaces" else "RFC 1123 subdomain"
                errors.append(FieldError.invalid("metadata.name", name, (
                    f"a lowercase {what} must consist of lower case alphanumeric characters, '-' or '.', and must "
                    "start and end with an alphanumeric character")))
        for key, value in (meta.get("labels") or {}).items():
            label_name = key.rpartition("/")[2]
            if not _LABEL_NAME_RE.match(label_name) or len(label_name) > 63:
                errors.append(FieldError.invalid("metadata.labels", key, "name part must consist of alphanumeric "
                                                 "characters, '-', '_' or '.', and must start and end with an "
                                                 "alphanumeric character"))
            if not isinstance(value, str) or not _LABEL_VALUE_RE.match(value) or len(value) > 63:
                errors.append(FieldError.invalid("metadata.labels", value, "a valid label must be an empty string or "
                                                 "consist of alphanumeric characters, '-', '_' or '.', and must start "
                                                 "and end with an alphanumeric character"))
        for key, value in (meta.get("annotations") or {}).items():
            if not isinstance(value, str):
                errors.append(FieldError.invalid(f"metadata.annotations[{key}]", value, "must be a string"))
        finalizers = meta.get("finalizers")
        if finalizers is not None and (not isinstance(finalizers, list)
                                       or not all(isinstance(f, str) and f for f in finalizers)):
            errors.append(FieldError.invalid("metadata.finalizers", finalizers, "must be a list of non-empty strings"))
        return errors

    @staticmethod
    def _normalize_meta(obj: dict[str, Any]) -> None:
        """Empty lists/maps in ObjectMeta are omitted, as the API server's omitempty does."""
        meta = obj["metadata"]
        for key in ("finalizers", "labels", "annotations", "ownerReferences", "managedFields"):
            if key in meta and meta[key] in ([], {}, None):
                del meta[key]

    def _normalize_builtin(self, rdef: ResourceDef, obj: dict[str, Any], creating: bool) -> None:
        if rdef.group == "" and rdef.plural == "secrets":
            string_data = obj.pop("stringData", None) or {}
            if string_data:
                obj["data"] = {**(obj.get("data") or {}),
                               **{k: base64.b64encode(str(v).encode()).decode() for k, v in string_data.items()}}
            if creating:
                obj.setdefault("type", "Opaque")
        elif rdef.group == "" and rdef.plural == "namespaces" and creating:
            obj["status"] = {"phase": "Active"}
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})

    def _admit(self, rdef: ResourceDef, obj: dict[str, Any], old: dict[str, Any] | None,
               params: Mapping[str, str]) -> None:
        """Pruning, defaulting and validation (raises 422/400 on problems)."""
        errors = self._validate_meta(rdef, obj)
        if rdef.schema is not None:
            pruned = rdef.schema.prune(obj)
            if pruned and params.get("fieldValidation") == "Strict":
                raise self._bad_request("strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in pruned))
            rdef.schema.default(obj)
            errors += rdef.schema.validate(obj, old)
        if rdef.gkey == _CRD_RESOURCE.gkey:
            try:
                crd_resources(obj)
            except ValueError as exc:
                errors += exc.args[0]
        if errors:
            raise self._invalid(rdef, obj["metadata"].get("name") or "", errors)

    def _ensure_namespace(self, namespace: str) -> None:
        ns_def = self.registry.resolve("v1/namespaces")
        ns_obj = self._bucket(ns_def).get((None, namespace))
        if ns_obj is None:
            if not self.auto_namespaces:
                raise _status_error(404, "NotFound", f'namespaces "{namespace}" not found',
                                    {"name": namespace, "kind": "namespaces"})
            self._create(ns_def, None, {"metadata": {"name": namespace}}, {})
        elif ns_obj["metadata"].get("deletionTimestamp"):
            raise _status_error(403, "Forbidden", f"unable to create new content in namespace {namespace} because "
                                "it is being terminated", {"name": namespace, "kind": "namespaces"})

    def _create(self, rdef: ResourceDef, namespace: str | None, body: Any, params: Mapping[str, str]) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise self._bad_request("the request body must be a JSON object")
        obj = copy.deepcopy(body)
        self._check_type_meta(rdef, obj)
        meta = obj["metadata"]
        if rdef.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise self._bad_request("the namespace of the provided object does not match the namespace sent "
                                        "on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        for key in SERVER_METADATA:
            meta.pop(key, None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise self._invalid(rdef, "", [FieldError.required("metadata.name",
                                                                   "name or generateName is required")])
            for _ in range(100):
                meta["name"] = meta["generateName"] + "".join(random.choices(_GENERATE_CHARS, k=5))
                if (namespace if rdef.namespaced else None, meta["name"]) not in self._bucket(rdef):
                    break
        if rdef.has_status:
            obj.pop("status", None)
        self._normalize_meta(obj)
        self._normalize_builtin(rdef, obj, creating=True)
        if rdef.namespaced:
            self._ensure_namespace(namespace or "")
        key = (namespace if rdef.namespaced else None, meta["name"])
        if key in self._bucket(rdef):
            raise _status_error(409, "AlreadyExists", f'{rdef.qualified} "{meta["name"]}" already exists',
                                {"name": meta["name"], "group": rdef.group, "kind": rdef.plural})
        self._admit(rdef, obj, None, params)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        if rdef.tracks_generation:
            meta["generation"] = 1
        if rdef.gkey == _CRD_RESOURCE.gkey:
            self._crd_status(obj)
        if params.get("dryRun"):
            return self._present(obj, rdef)
        meta["resourceVersion"] = self._next_rv()
        self._put(rdef, obj)
        self._emit(rdef, "ADDED", obj)
        if rdef.gkey == _CRD_RESOURCE.gkey:
            self._on_crd_written(obj)
        return self._present(obj, rdef)

    def _replace(self, rdef: ResourceDef, namespace: str | None, name: str, body: Any, subresource: str | None,
                 params: Mapping[str, str]) -> dict[str, Any]:
        old = self._bucket(rdef).get((namespace if rdef.namespaced else None, name))
        if old is None:
            raise self._not_found(rdef, name)
        if not isinstance(body, dict):
            raise self._bad_request("the request body must be a JSON object")
        candidate = copy.deepcopy(body)
        if rdef.custom and not (candidate.get("metadata") or {}).get("resourceVersion"):
            raise self._invalid(rdef, name, [FieldError.invalid("metadata.resourceVersion", 0,
                                                                "must be specified for an update")])
        return self._update(rdef, old, candidate, subresource, params)

    def _patch(self, rdef: ResourceDef, namespace: str | None, name: str, patch: Any, content_type: str,
               subresource: str | None, params: Mapping[str, str]) -> dict[str, Any]:
        content_type = content_type.split(";")[0].strip().lower()
        old = self._bucket(rdef).get((namespace if rdef.namespaced else None, name))
        if old is None:
            if content_type == "application/apply-patch+yaml" and subresource is None:
                body = {**patch, "metadata": {**(patch.get("metadata") or {}), "name": name}}
                return self._create(rdef, namespace, body, params)
            raise self._not_found(rdef, name)
        base = copy.deepcopy(self._present(old, rdef))
        if content_type == "application/json-patch+json":
            if not isinstance(patch, list):
                raise self._bad_request("json patch must be a list of operations")
            try:
                candidate = jsonpatch.JsonPatch(patch).apply(base)
            except jsonpatch.JsonPatchTestFailed as exc:
                raise _status_error(422, "Invalid", f"the server rejected our request due to an error in our "
                                    f"request: test operation failed: {exc}",
                                    {"name": name, "kind": rdef.plural}) from None
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError, KeyError) as exc:
                raise _status_error(422, "Invalid", f"the server rejected our request due to an error in our "
                                    f"request: {exc}", {"name": name, "kind": rdef.plural}) from None
        elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json",
                              "application/apply-patch+yaml", "application/json"):
            if not isinstance(patch, dict):
                raise self._bad_request("merge patch must be a JSON object")
            candidate = merge_patch(base, patch)
        else:
            raise _status_error(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                "accepted media types include: application/json-patch+json, "
                                "application/merge-patch+json, application/apply-patch+yaml")
        return self._update(rdef, old, candidate, subresource, params)

    def _update(self, rdef: ResourceDef, old: dict[str, Any], candidate: Any, subresource: str | None,
                params: Mapping[str, str]) -> dict[str, Any]:
        if not isinstance(candidate, dict):
            raise self._bad_request("the object must be a JSON object")
        candidate = copy.deepcopy(candidate)
        self._check_type_meta(rdef, candidate)
        old_meta, cand_meta = old["metadata"], candidate["metadata"]
        name = old_meta["name"]
        if cand_meta.get("name", name) != name:
            raise self._bad_request(f"the name of the object ({cand_meta.get('name')}) does not match the name on "
                                    f"the URL ({name})")
        if rdef.namespaced and cand_meta.get("namespace", old_meta.get("namespace")) != old_meta.get("namespace"):
            raise self._bad_request("the namespace of the provided object does not match the namespace sent on the "
                                    "request")
        rv = cand_meta.get("resourceVersion")
        if rv not in (None, "") and str(rv) != old_meta["resourceVersion"]:
            raise self._conflict(rdef, name)

        if subresource == "status":
            new = copy.deepcopy(old)
            if "status" in candidate:
                new["status"] = candidate["status"]
            else:
                new.pop("status", None)
        elif subresource is not None:
            raise _status_error(405, "MethodNotAllowed", f"subresource {subresource} is not supported by the emulator")
        else:
            new = candidate
            if rdef.has_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
        new_meta = new["metadata"]
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                    "name", "namespace", "resourceVersion"):
            if key in old_meta:
                new_meta[key] = old_meta[key]
            else:
                new_meta.pop(key, None)
        if old_meta.get("deletionTimestamp"):
            added = [f for f in new_meta.get("finalizers") or [] if f not in (old_meta.get("finalizers") or [])]
            if added:
                raise self._invalid(rdef, name, [FieldError.forbidden(
                    "metadata.finalizers", f"no new finalizers can be added if the object is being deleted, found "
                    f"new finalizers {json.dumps(added)}")])
        self._normalize_meta(new)
        self._normalize_builtin(rdef, new, creating=False)
        self._admit(rdef, new, old, params)
        if new == old:
            return self._present(old, rdef)  # a no-op: no new resourceVersion, no watch event
        if rdef.tracks_generation:
            excluded = ("metadata", "status") if rdef.has_status else ("metadata",)
            if ({k: v for k, v in new.items() if k not in excluded}
                    != {k: v for k, v in old.items() if k not in excluded}):
                new_meta["generation"] = int(old_meta.get("generation") or 0) + 1
        if rdef.gkey == _CRD_RESOURCE.gkey:
            self._crd_status(new)
        if params.get("dryRun"):
            return self._present(new, rdef)
        new_meta["resourceVersion"] = self._next_rv()
        if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            self._remove(rdef, new, prev=old)
            return self._present(new, rdef)
        self._put(rdef, new)
        self._emit(rdef, "MODIFIED", new, prev=old)
        if rdef.gkey == _CRD_RESOURCE.gkey:
            self._on_crd_written(new)
        return self._present(new, rdef)

    def _delete(self, rdef: ResourceDef, namespace: str | None, name: str, body: Any,
                params: Mapping[str, str]) -> dict[str, Any]:
        old = self._bucket(rdef).get((namespace if rdef.namespaced else None, name))
        if old is None:
            raise self._not_found(rdef, name)
        options = body if isinstance(body, dict) else {}
        pre = options.get("preconditions") or {}
        meta = old["metadata"]
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise self._conflict(rdef, name, f"Precondition failed: UID in precondition: {pre['uid']}, "
                                             f"UID in object meta: {meta['uid']}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise self._conflict(rdef, name, f"Precondition failed: ResourceVersion in precondition: "
                                             f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                                             f"{meta['resourceVersion']}")
        if params.get("dryRun") or options.get("dryRun"):
            return self._present(old, rdef)
        policy = options.get("propagationPolicy") or params.get("propagationPolicy")
        result = self._delete_object(rdef, old, orphan=policy == "Orphan")
        if result is None and rdef.custom:
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "group": rdef.group, "kind": rdef.plural, "uid": meta["uid"]}}
        return self._present(result or old, rdef)

    def _delete_collection(self, rdef: ResourceDef, namespace: str | None, body: Any,
                           params: Mapping[str, str]) -> dict[str, Any]:
        selectors = {k: v for k, v in params.items() if k in ("labelSelector", "fieldSelector")}
        listing = self._list(rdef, namespace, selectors)
        for item in listing["items"]:
            current = self._bucket(rdef).get((item["metadata"].get("namespace"), item["metadata"]["name"]))
            if current is not None and not (params.get("dryRun")):
                self._delete_object(rdef, current, orphan=params.get("propagationPolicy") == "Orphan")
        return listing

    def _delete_object(self, rdef: ResourceDef, obj: dict[str, Any], orphan: bool = False) -> dict[str, Any] | None:
        """Delete honouring finalizers; returns the deleting object, or None if it was removed at once."""
        meta = obj["metadata"]
        is_namespace = rdef.group == "" and rdef.plural == "namespaces"
        if meta.get("finalizers") or is_namespace:
            if meta.get("deletionTimestamp"):
                return obj
            new = copy.deepcopy(obj)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["metadata"]["resourceVersion"] = self._next_rv()
            if is_namespace:
                new["status"] = {"phase": "Terminating"}
            self._put(rdef, new)
            self._emit(rdef, "MODIFIED", new, prev=obj)
            if is_namespace:
                self._terminate_namespace(meta["name"])
                return self._bucket(rdef).get((None, meta["name"]))  # None if already gone
            return new
        final = copy.deepcopy(obj)
        final["metadata"]["resourceVersion"] = self._next_rv()
        self._remove(rdef, final, prev=obj, orphan=orphan)
        return None

    def _remove(self, rdef: ResourceDef, final: dict[str, Any], prev: dict[str, Any] | None = None,
                orphan: bool = False) -> None:
        meta = final["metadata"]
        key = (meta.get("namespace") if rdef.namespaced else None, meta["name"])
        self._bucket(rdef).pop(key, None)
        self._uids.pop(meta["uid"], None)
        self._emit(rdef, "DELETED", final, prev=prev)
        if rdef.gkey == _CRD_RESOURCE.gkey:
            self._on_crd_removed(final)
        if not orphan:
            self._collect_garbage(meta["uid"])
        if rdef.namespaced and meta.get("namespace"):
            self._maybe_finish_namespace(meta["namespace"])

    def _collect_garbage(self, owner_uid: str) -> None:
        dependents = []
        for gkey, objects in self._store.items():
            for obj in objects.values():
                refs = obj["metadata"].get("ownerReferences") or []
                if any(ref.get("uid") == owner_uid for ref in refs):
                    alive = [ref for ref in refs if ref.get("uid") != owner_uid and ref.get("uid") in self._uids]
                    if not alive:
                        dependents.append((gkey, obj))
        for (group, plural), obj in dependents:
            rdef = self.registry.preferred(group, plural)
            current = self._uids.get(obj["metadata"]["uid"])
            if rdef is not None and current is not None:
                self._delete_object(rdef, self._store[current[0]][current[1]])

    def _terminate_namespace(self, namespace: str) -> None:
        for (group, plural), objects in list(self._store.items()):
            rdef = self.registry.preferred(group, plural)
            if rdef is None or not rdef.namespaced:
                continue
            for key in [k for k in objects if k[0] == namespace]:
                if key in objects:
                    self._delete_object(rdef, objects[key])
        self._maybe_finish_namespace(namespace)

    def _maybe_finish_namespace(self, namespace: str) -> None:
        ns_def = self.registry.resolve("v1/namespaces")
        ns_obj = self._bucket(ns_def).get((None, namespace))
        if ns_obj is None or not ns_obj["metadata"].get("deletionTimestamp") or ns_obj["metadata"].get("finalizers"):
            return
        if any(key[0] == namespace for objects in self._store.values() for key in objects):
            return
        final = copy.deepcopy(ns_obj)
        final["metadata"]["resourceVersion"] = self._next_rv()
        self._remove(ns_def, final, prev=ns_obj)

    # --- CRDs as objects -------------------------------------------------------------------------

    @staticmethod
    def _crd_status(crd: dict[str, Any]) -> None:
        spec = crd.get("spec") or {}
        storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
        previous = (crd.get("status") or {}).get("storedVersions") or []
        crd["status"] = {
            "acceptedNames": spec.get("names") or {},
            "storedVersions": sorted(set(previous) | set(storage)),
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": _now()},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": _now()},
            ],
        }

    def _on_crd_written(self, crd: dict[str, Any]) -> None:
        rdefs = crd_resources(crd)
        self.registry.replace_crd(crd["metadata"]["name"], [])
        for rdef in rdefs:
            self._register(rdef)

    def _on_crd_removed(self, crd: dict[str, Any]) -> None:
        removed = self.registry.remove_crd(crd["metadata"]["name"])
        for rdef in removed:
            with contextlib.suppress(KeyError):
                del self.resources[f"{rdef.group}/{rdef.version}/{rdef.plural}"]
        if removed:
            rdef = removed[0]
            for obj in list(self._store.pop(rdef.gkey, {}).values()):
                final = copy.deepcopy(obj)
                final["metadata"]["resourceVersion"] = self._next_rv()
                self._uids.pop(obj["metadata"]["uid"], None)
                self._emit(rdef, "DELETED", final, prev=obj)

    # --- lifecycle -------------------------------------------------------------------------------

    def stop_watches(self) -> None:
        self._stopping = True
        for queue in self._watchers:
            queue.put_nowait(_STOP)



# ------------------------------------------------------------------------------------------------
# The threaded server and the sync client for tests
# ------------------------------------------------------------------------------------------------

class ApiError(Exception):
    """A non-2xx answer of the emulator (``status`` is the HTTP code, ``body`` the Status object)."""

    def __init__(self, status: int, body: Any, method: str = "", path: str = "") -> None:
        self.status = status
        self.body = body if isinstance(body, dict) else {"message": str(body)}
        self.reason = self.body.get("reason", "")
        self.message = self.body.get("message", "")
        super().__init__(f"{method} {path} -> {status} {self.reason}: {self.message}")


class K8sApi:
    """A Kubernetes API emulator served on 127.0.0.1 from a background thread, plus a sync client.

    ``crd_dirs``: directories whose ``*.yaml``/``*.yml`` CRDs are loaded (default: the repo's ``crds/``);
    ``crd_files``: extra CRD files (default: the SparkApplication CRD); ``crds``: extra CRD dicts.
    kopf's peering CRDs are always served. ``namespaces`` are created at startup; other namespaces are
    created on first use unless ``auto_namespaces=False`` (then a 404, as in a real cluster).
    """

    def __init__(self, crd_dirs: Iterable[str | os.PathLike[str]] | None = None,
                 crd_files: Iterable[str | os.PathLike[str]] | None = None,
                 crds: Iterable[Mapping[str, Any]] = (), *, namespaces: Iterable[str] = ("default",),
                 auto_namespaces: bool = True, bookmark_interval: float = 30.0, port: int = 0,
                 request_timeout: float = 10.0) -> None:
        self.crd_dirs = [Path(d) for d in (crd_dirs if crd_dirs is not None else [DEFAULT_CRD_DIR])]
        if crd_files is None:
            crd_files = [SPARK_CRD_PATH] if SPARK_CRD_PATH.exists() else []
            if not SPARK_CRD_PATH.exists():
                logger.warning("SparkApplication CRD not found at %s", SPARK_CRD_PATH)
        self.crd_files = [Path(f) for f in crd_files]
        self.extra_crds = [dict(c) for c in crds]
        self.namespaces = list(namespaces)
        self.auto_namespaces = auto_namespaces
        self.bookmark_interval = bookmark_interval
        self.port = port
        self.request_timeout = request_timeout
        self.url = ""
        self.emulator: ApiServerEmulator | None = None
        self.loaded_crds: list[str] = []
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        self._http: httpx.Client | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> K8sApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0) -> K8sApi:
        self._thread = threading.Thread(target=self._thread_main, name="k8s-api-emulator", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError("the Kubernetes API emulator did not start in time")
        if self._startup_error is not None:
            self._thread.join(5)
            raise RuntimeError(f"the Kubernetes API emulator failed to start: {self._startup_error}") \
                from self._startup_error
        self._http = httpx.Client(base_url=self.url, timeout=self.request_timeout)
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._loop is not None and self._stop_event is not None and self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop_event.set)
            self._thread.join(15)
        self._loop = self._stop_event = None

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._amain())
        except BaseException as exc:  # surfaced by start()
            self._startup_error = exc
            self._started.set()

    def _load_crds(self, emulator: ApiServerEmulator) -> None:
        sources: list[tuple[str, Mapping[str, Any]]] = [("kopf", crd) for crd in KOPF_PEERING_CRDS]
        for directory in self.crd_dirs:
            for path in crd_files(directory):
                sources += [(str(path), crd) for crd in load_crd_documents(path)]
        for path in self.crd_files:
            sources += [(str(path), crd) for crd in load_crd_documents(path)]
        sources += [("<crds>", crd) for crd in self.extra_crds]
        for origin, crd in sources:
            try:
                emulator.install_crd(crd)
            except kmock.KubernetesError as exc:
                raise ValueError(f"{origin}: invalid CRD: {exc.message}") from None
            self.loaded_crds.append(crd["metadata"]["name"])

    async def _amain(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        emulator = ApiServerEmulator(auto_namespaces=self.auto_namespaces, bookmark_interval=self.bookmark_interval)
        self.emulator = emulator
        self._load_crds(emulator)
        ns_def = emulator.registry.resolve("v1/namespaces")
        for namespace in self.namespaces:
            emulator._create(ns_def, None, {"metadata": {"name": namespace}}, {})
        async with emulator, kmock.Server(emulator, host="127.0.0.1", port=self.port or None) as server:
            self.url = f"http://127.0.0.1:{server.port}"
            self._started.set()
            await self._stop_event.wait()
            emulator.stop_watches()
            await asyncio.sleep(0.05)

    # --- kubeconfig ------------------------------------------------------------------------------

    def kubeconfig(self, path: str | os.PathLike[str], namespace: str = "default") -> Path:
        """Write a kubeconfig pointing at the emulator (plain HTTP) and return its path."""
        path = Path(path)
        if path.is_dir():
            path = path / "kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator", "preferences": {},
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": "emulator-token"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator",
                                                          "namespace": namespace}}],
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return path

    # --- sync client -----------------------------------------------------------------------------

    def resource(self, ref: str | ResourceDef) -> ResourceDef:
        """Resolve ``tablereplicas`` / ``TableReplica`` / ``sparkapp`` / ``group/version/plural``."""
        assert self.emulator is not None, "the emulator is not started"
        return self.emulator.registry.resolve(ref)

    def request(self, method: str, path: str, *, json_body: Any = None, content_type: str | None = None,
                params: Mapping[str, str] | None = None) -> Any:
        """A raw request; returns the decoded JSON answer or raises ApiError."""
        assert self._http is not None, "the emulator is not started"
        headers = {"Content-Type": content_type} if content_type else {}
        content = json.dumps(json_body).encode() if json_body is not None else None
        if content is not None and not content_type:
            headers["Content-Type"] = "application/json"
        response = self._http.request(method, path, content=content, headers=headers, params=params)
        try:
            body = response.json()
        except ValueError:
            body = response.text
        if response.status_code >= 400:
            raise ApiError(response.status_code, body, method, path)
        return body

    def _target(self, resource: str | ResourceDef | Mapping[str, Any], name: str | None,
                namespace: str | None) -> tuple[ResourceDef, str | None, str | None]:
        if isinstance(resource, Mapping):
            rdef = self._kind_of(resource)
            meta = resource.get("metadata") or {}
            name = name or meta.get("name")
            namespace = namespace or meta.get("namespace")
        else:
            rdef = self.resource(resource)
        if rdef.namespaced:
            namespace = namespace or "default"
        else:
            namespace = None
        return rdef, name, namespace

    def _kind_of(self, obj: Mapping[str, Any]) -> ResourceDef:
        assert self.emulator is not None, "the emulator is not started"
        rdef = self.emulator.registry.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        if rdef is None:
            raise KeyError(f"no served resource for apiVersion={obj.get('apiVersion')!r} kind={obj.get('kind')!r}")
        return rdef

    def create(self, obj: Mapping[str, Any], namespace: str | None = None, **params: str) -> dict[str, Any]:
        """POST an object (its resource is found by apiVersion+kind; namespace from the object or 'default')."""
        rdef, _, namespace = self._target(obj, None, namespace)
        return self.request("POST", rdef.path(namespace), json_body=dict(obj), params=params or None)

    def get(self, resource: str | ResourceDef | Mapping[str, Any], name: str | None = None,
            namespace: str | None = None) -> dict[str, Any]:
        rdef, name, namespace = self._target(resource, name, namespace)
        return self.request("GET", rdef.path(namespace, name))

    def get_or_none(self, resource: str | ResourceDef | Mapping[str, Any], name: str | None = None,
                    namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.get(resource, name, namespace)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, resource: str | ResourceDef, namespace: str | None = None, *, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict[str, Any]]:
        """List objects (all namespaces when ``namespace`` is None)."""
        rdef = self.resource(resource)
        params = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        return self.request("GET", rdef.path(namespace), params=params or None)["items"]

    def patch(self, resource: str | ResourceDef | Mapping[str, Any], name: str | None = None, patch: Any = None,
              namespace: str | None = None, *, patch_type: str = "merge", subresource: str | None = None,
              **params: str) -> dict[str, Any]:
        """PATCH with ``patch_type`` merge (default), json, strategic or apply; ``subresource='status'``."""
        rdef, name, namespace = self._target(resource, name, namespace)
        content_type = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                        "strategic": "application/strategic-merge-patch+json",
                        "apply": "application/apply-patch+yaml"}[patch_type]
        return self.request("PATCH", rdef.path(namespace, name, subresource), json_body=patch,
                            content_type=content_type, params=params or None)

    def patch_status(self, resource: str | ResourceDef | Mapping[str, Any], name: str | None = None,
                     status: Mapping[str, Any] | None = None, namespace: str | None = None) -> dict[str, Any]:
        return self.patch(resource, name, {"status": dict(status or {})}, namespace, subresource="status")

    def replace(self, obj: Mapping[str, Any], *, subresource: str | None = None, **params: str) -> dict[str, Any]:
        """PUT the whole object (it must carry metadata.resourceVersion for custom resources)."""
        rdef, name, namespace = self._target(obj, None, None)
        return self.request("PUT", rdef.path(namespace, name, subresource), json_body=dict(obj), params=params or None)

    def delete(self, resource: str | ResourceDef | Mapping[str, Any], name: str | None = None,
               namespace: str | None = None, *, propagation_policy: str | None = None,
               preconditions: Mapping[str, str] | None = None) -> dict[str, Any]:
        rdef, name, namespace = self._target(resource, name, namespace)
        options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if preconditions:
            options["preconditions"] = dict(preconditions)
        return self.request("DELETE", rdef.path(namespace, name), json_body=options)

    def watch(self, resource: str | ResourceDef, namespace: str | None = None, *,
              resource_version: str | None = None, timeout_seconds: float = 1, label_selector: str | None = None,
              field_selector: str | None = None, send_initial_events: bool = False,
              allow_bookmarks: bool = False) -> list[dict[str, Any]]:
        """Open a watch stream, let the server end it after ``timeout_seconds``, return all its events."""
        assert self._http is not None, "the emulator is not started"
        rdef = self.resource(resource)
        params = {"watch": "true", "timeoutSeconds": str(timeout_seconds)}
        for key, value in (("resourceVersion", resource_version), ("labelSelector", label_selector),
                           ("fieldSelector", field_selector)):
            if value is not None:
                params[key] = value
        if send_initial_events:
            params.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan")
        if allow_bookmarks:
            params["allowWatchBookmarks"] = "true"
        path = rdef.path(namespace)
        with self._http.stream("GET", path, params=params, timeout=timeout_seconds + self.request_timeout) as rsp:
            if rsp.status_code >= 400:
                rsp.read()
                raise ApiError(rsp.status_code, rsp.json(), "WATCH", path)
            return [json.loads(line) for line in rsp.iter_lines() if line.strip()]

    def events(self, namespace: str | None = None, *, involved_name: str | None = None,
               involved_kind: str | None = None, reason: str | None = None) -> list[dict[str, Any]]:
        """Core v1 Events (as kopf posts them), oldest first, optionally filtered."""
        events = [e for e in self.list("v1/events", namespace)
                  if (involved_name is None or e.get("involvedObject", {}).get("name") == involved_name)
                  and (involved_kind is None or e.get("involvedObject", {}).get("kind") == involved_kind)
                  and (reason is None or e.get("reason") == reason)]
        return sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05,
                 message: str = "") -> Any:
        """Poll ``predicate`` until it returns a truthy value (a 404 ApiError counts as falsy); return it.

        :func:`reptables.testing.wait_for` with the emulator's rule for errors: an object not there
        yet (404) is "not yet", any other error propagates; on timeout it raises
        :class:`~reptables.testing.WaitTimeout` (a ``TimeoutError``).
        """
        def found() -> Any:
            try:
                return predicate()
            except ApiError as exc:
                if exc.status != 404:
                    raise
                return None

        return wait_for(found, timeout, message or "condition", interval=interval, retry_on=())

    def wait_for_deletion(self, resource: str | ResourceDef | Mapping[str, Any], name: str | None = None,
                          namespace: str | None = None, timeout: float = 10.0) -> None:
        self.wait_for(lambda: self.get_or_none(resource, name, namespace) is None, timeout,
                      message=f"deletion of {name or resource}")

    def active_watches(self) -> list[tuple[str, str, str, str | None]]:
        assert self.emulator is not None, "the emulator is not started"
        return self.emulator.active_watches()

    def wait_for_watch(self, resource: str | ResourceDef, namespace: str | None = None, timeout: float = 20.0) -> None:
        """Wait until some client (e.g. kopf) watches ``resource`` (in ``namespace`` or cluster-wide)."""
        rdef = self.resource(resource)
        self.wait_for(lambda: any(w[0] == rdef.group and w[2] == rdef.plural and w[3] in (namespace, None)
                                  for w in self.active_watches()),
                      timeout, 0.05, message=f"a watch on {rdef.qualified}")

    def request_log(self) -> list[dict[str, Any]]:
        """Every request the emulator has served so far: method, path, params and decoded body."""
        assert self.emulator is not None, "the emulator is not started"
        return [{"method": str(getattr(r.method, "value", r.method)).upper(), "path": r.url.path,
                 "params": dict(r.params), "data": r.data} for r in list(self.emulator.history)]

    def server_errors(self) -> list[Exception]:
        """Unexpected (non-Kubernetes) exceptions raised inside the emulator: should stay empty."""
        assert self.emulator is not None, "the emulator is not started"
        return list(self.emulator.errors)


class KopfProcess:
    """``kopf run ARGS`` as a subprocess in its own process group, pointed at a kubeconfig.

    Stopped by its pid (SIGTERM to its process group, then SIGKILL) on ``stop()``/context exit.
    """

    def __init__(self, args: Iterable[str], *, kubeconfig: str | os.PathLike[str], log_path: str | os.PathLike[str],
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None) -> None:
        self.args = list(args)
        self.kubeconfig = Path(kubeconfig)
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.cwd = Path(cwd) if cwd else REPO_ROOT
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> KopfProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> KopfProcess:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1", **self.env}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "kopf", "run", *self.args], stdout=log,
                                         stderr=subprocess.STDOUT, env=env, cwd=self.cwd, start_new_session=True)
        return self

    def logs(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)  # our own session: pgid == pid
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode


@pytest.fixture
def k8s_api() -> Iterator[K8sApi]:
    """A fresh emulator per test with crds/ + the SparkApplication CRD (+ kopf peering CRDs)."""
    with K8sApi() as api:
        yield api
        errors = api.server_errors()
        assert not errors, f"the Kubernetes API emulator failed internally: {errors!r}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the Kubernetes API emulator on 127.0.0.1.")
    parser.add_argument("--crds", action="append", help="a CRD directory (repeatable; default: crds/)")
    parser.add_argument("--crd-file", action="append", help="an extra CRD file (default: the SparkApplication CRD)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--kubeconfig", help="write a kubeconfig for the emulator to this path")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    with K8sApi(crd_dirs=args.crds, crd_files=args.crd_file, port=args.port) as api:
        print(f"Kubernetes API emulator at {api.url}; CRDs: {', '.join(api.loaded_crds)}", flush=True)
        if args.kubeconfig:
            print(f"kubeconfig: {api.kubeconfig(args.kubeconfig)}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
