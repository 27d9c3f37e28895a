"""Small JSON documents written next to run outputs (manifests, summaries), atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from recs.errors import RunNotFoundError


def write_json(path: Path, document: Any) -> Path:
    """Write ``document`` as indented, key-sorted JSON via a temp file and ``os.replace``.

    The replace is atomic on POSIX, so a reader sees the old file or the new one, never half.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def read_json(path: Path) -> Any:
    """Read a JSON document; a missing file raises ``RunNotFoundError`` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunNotFoundError(f"missing {path}") from None
