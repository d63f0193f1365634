"""Reading the manifests ``reptables up`` runs: the files a path names, and one file checked whole.

The local runner takes the same YAML ``kubectl apply`` takes. A file is applied only when every
document in it is valid (parsed by the operator's models, as the API server's schema would check
it), so an edit saved half-way never leaves half an object set behind; the error names the file,
the object and the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from .. import models
from ..controllers.dispatch import ORDER


class ManifestError(ValueError):
    """A manifest file that cannot be applied: the message names the file, the object and the reason."""


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
        docs = [d for d in yaml.safe_load_all(file.read_text()) if d]
    except OSError as exc:
        raise ManifestError(f"manifest {file}: cannot be read: {exc.strerror}") from None
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
