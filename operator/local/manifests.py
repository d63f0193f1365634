"""Reading the manifests ``reptables up`` runs: the files a path names, and one file checked whole;
and editing one field of one object in them, as ``reptables promote|enable|disable`` do.

The local runner takes the same YAML ``kubectl apply`` takes. A file is applied only when every
document in it is valid (parsed by the operator's models, as the API server's schema would check
it), so an edit saved half-way never leaves half an object set behind; the error names the file,
the object and the field.

An edit (:func:`set_spec_field`) changes the file's text in one place - the value of the field, or
one new line in the object's ``spec`` - so the user's comments, order and layout stay; the result
must load to exactly the documents before with that one field changed, and be valid, or nothing
is written.

Across files, one check the models cannot make alone (:func:`port_conflict`): on one machine two
TableClusters never name one loopback port.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from .. import models
from ..controllers.dispatch import ORDER


class ManifestError(ValueError):
    """A manifest file that cannot be applied: the message names the file, the object and the reason."""


def port_conflict(clusters: Iterable[tuple[str, Sequence[str]]], name: str, ports: Collection[int],
                  loopback: Sequence[str]) -> str | None:
    """Why TableCluster ``name`` cannot have its engines on ``ports`` on this machine: another TableCluster's
    endpoint or member names one of them too (both engines would be started on it, one would answer
    for the other, and the other's token would be refused). None when no other one does."""
    for other, urls in clusters:
        for url in urls if other != name else ():
            parsed = urlparse(url)
            if parsed.hostname in loopback and parsed.port is not None and parsed.port in ports:
                return (f"TableCluster {name}: port {parsed.port} is also TableCluster {other}'s ({url}): on one "
                        "machine each engine needs a port of its own")
    return None


def manifest_files(paths: Iterable[Path]) -> list[Path]:
    """The YAML files the paths name (a directory: its ``*.yaml`` and ``*.yml``, not recursive)."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml"))
        elif path.exists():
            files.append(path)
    return files


def load_manifests(paths: Iterable[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for file in manifest_files(paths):
        for doc in yaml.safe_load_all(file.read_text()):
            if doc:
                docs.append(doc)
    return docs


def load_file(file: Path) -> list[dict[str, Any]]:
    """Every document of one manifest file, each checked as ``kubectl apply`` would, or ManifestError.

    Nothing of a file is applied unless all of it is valid, so an edit half-way through never
    leaves half an object set behind.
    """
    try:
        text = file.read_text()
    except OSError as exc:
        raise ManifestError(f"manifest {file}: cannot be read: {exc.strerror}") from None
    return load_text(file, text)


def load_text(file: Path, text: str) -> list[dict[str, Any]]:
    """:func:`load_file` of ``text`` as the content of ``file``."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ManifestError(f"manifest {file}: invalid YAML{where}: {problem}") from None
    for doc in docs:
        if not isinstance(doc, dict):
            raise ManifestError(f"manifest {file}: a document is a {type(doc).__name__}, not an object")
        kind = doc.get("kind")
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise ManifestError(f"manifest {file}: a {kind or 'document'} has no metadata.name")
        if kind == "Secret":
            continue
        if kind not in ORDER:
            raise ManifestError(f"manifest {file}: {kind} {name}: the local runner manages "
                                f"{', '.join(ORDER)} and Secrets")
        try:
            models.parse_resource(doc)
        except (models.InvalidResourceError, ValueError) as exc:
            raise ManifestError(f"manifest {file}: {exc}") from None
    return docs


# -- editing one field -------------------------------------------------------------------------------


def _scalar(node: yaml.Node | None) -> str | None:
    return str(node.value) if isinstance(node, yaml.ScalarNode) else None


def _entry(node: yaml.Node | None, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    """The (key, value) nodes of ``key`` in a mapping node."""
    if not isinstance(node, yaml.MappingNode):
        return None
    return next(((k, v) for k, v in node.value if _scalar(k) == key), None)


def _identity(node: yaml.Node | None) -> tuple[str | None, str | None, str | None]:
    """A document's (kind, metadata.namespace, metadata.name) from its node."""
    kind = _entry(node, "kind")
    meta = _entry(node, "metadata")
    meta_node = meta[1] if meta is not None else None
    namespace, name = _entry(meta_node, "namespace"), _entry(meta_node, "name")
    return (_scalar(kind[1]) if kind else None, _scalar(namespace[1]) if namespace else None,
            _scalar(name[1]) if name else None)


def find_object(paths: Iterable[Path], kind: str, namespace: str, name: str,
                default_namespace: str = "default") -> list[Path]:
    """The manifest files (of the paths ``up`` watches) that hold the object (a document without a
    namespace is in ``default_namespace``, as ``up`` reads it). Unreadable files are skipped."""
    found = []
    for file in manifest_files(paths):
        try:
            nodes = list(yaml.compose_all(file.read_text()))
        except (OSError, yaml.YAMLError):
            continue
        for node in nodes:
            doc_kind, doc_ns, doc_name = _identity(node)
            if (doc_kind, doc_ns or default_namespace, doc_name) == (kind, namespace, name):
                found.append(file)
                break
    return found


def _yaml_value(value: Any) -> str:
    """A plain scalar as YAML writes it (``true``, ``sync``)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def set_spec_field(file: Path, text: str, kind: str, namespace: str, name: str, field: str, value: Any,
                   default_namespace: str = "default") -> str:
    """``text`` (the content of ``file``) with ``spec.<field>`` of the object set to ``value``: the
    field's value replaced where it is written, or a line ``field: value`` added at the top of the
    object's ``spec``. ManifestError when the object or its spec is not there, when the edit would
    change anything else, or when the result is not a valid manifest."""
    where = f"manifest {file}: {kind} {namespace}/{name}"
    try:
        nodes = list(yaml.compose_all(text))
    except yaml.YAMLError as exc:
        raise ManifestError(f"manifest {file}: invalid YAML: {' '.join(str(exc).split())}") from None
    target = [n for n in nodes if (lambda i: (i[0], i[1] or default_namespace, i[2]))(_identity(n))
              == (kind, namespace, name)]
    if len(target) != 1:
        raise ManifestError(f"{where}: {'not found' if not target else 'written more than once'} in the file")
    spec = _entry(target[0], "spec")
    if spec is None or not isinstance(spec[1], yaml.MappingNode):
        raise ManifestError(f"{where}: has no spec mapping to edit")
    written = _yaml_value(value)
    mapping = spec[1]
    current = _entry(mapping, field)
    if current is not None:
        start, end = current[1].start_mark.index, current[1].end_mark.index
        edited = text[:start] + written + text[end:]
    elif mapping.flow_style:  # spec: {table: t, ...}
        at = mapping.start_mark.index + 1
        edited = text[:at] + f"{field}: {written}" + (", " if mapping.value else "") + text[at:]
    elif mapping.value:  # a line of its own above the first key, with that key's indentation
        first = mapping.value[0][0].start_mark
        edited = text[:first.index] + f"{field}: {written}\n" + " " * first.column + text[first.index:]
    else:
        raise ManifestError(f"{where}: has an empty spec")
    # exactly one field changed, nothing else: what the edited text loads to, compared with the original
    before = [d for d in yaml.safe_load_all(text)]
    try:
        after = [d for d in yaml.safe_load_all(edited)]
    except yaml.YAMLError:
        after = []
    index = nodes.index(target[0])
    expected = [dict(d) if i == index else d for i, d in enumerate(before)]
    expected[index] = {**before[index], "spec": {**before[index]["spec"], field: value}}
    if after != expected:
        raise ManifestError(f"{where}: spec.{field} cannot be edited in place in this file's layout; "
                            "edit it by hand")
    load_text(file, edited)  # valid as a whole, as up will check it
    return edited
