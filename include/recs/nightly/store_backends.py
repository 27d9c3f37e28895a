"""What ``artifacts.RunStore`` needs to know of fsspec's backends: a ``file:`` URL's path, an S3
store's default timeouts and retries, a listing entry's modification time, a backend's error as
one line.

Sources: RFC 8089 (``file:`` URLs); botocore's ``Config`` (``connect_timeout``, ``read_timeout``,
``retries``) as s3fs passes ``config_kwargs``; s3fs's ``S3FileSystem.retries``.
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any
from urllib.parse import unquote, urlparse

from recs.errors import RunStoreError


def modified_time(info: dict[str, Any]) -> float:
    """An fsspec listing entry's modification time (local ``mtime``, S3 ``LastModified``, the
    memory filesystem's ``created``), epoch seconds; now if it has none."""
    for key in ("mtime", "LastModified", "last_modified", "created"):
        value = info.get(key)
        if isinstance(value, dt.datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
    return dt.datetime.now(dt.UTC).timestamp()


def first_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]


def file_url_path(url: str) -> str:
    """The path of a ``file:`` URL (RFC 8089: percent-encoded, host empty or ``localhost``; fsspec
    would keep the escapes and read a host as a relative folder). Raises ``RunStoreError``."""
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
        raise RunStoreError(
            f"unusable run store {url!r} (RECS_RUN_STORE_URL): a file URL names a folder of this "
            "machine, file:///path (a shared volume mounted at the same path on every worker)"
        )
    return unquote(parsed.path)


#: An S3 run store's defaults (botocore's ``Config`` through s3fs's ``config_kwargs``), under
#: any the options set, and s3fs's own retries of a timed-out call (``S3_CALL_RETRIES``, its
#: class default 5): without them an endpoint that accepts connections and never answered held
#: a task for 415 s (a review's finding); with them a call gives up after about 3 x 2 x 20 s.
#: ``read_timeout`` is per socket read, not per transfer. Fewer retries than botocore's and
#: s3fs's defaults (5 each) also on throttling: Airflow's retries of the task cover a burst.
S3_CONFIG = {"connect_timeout": 10, "read_timeout": 20, "retries": {"max_attempts": 2}}
S3_CALL_RETRIES = 3


def s3_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``config_kwargs`` over ``S3_CONFIG``, key by key (a deep copy:
    botocore rewrites the ``retries`` it is given in place)."""
    config = copy.deepcopy({**S3_CONFIG, **(options.get("config_kwargs") or {})})
    return {**options, "config_kwargs": config}
