"""Write the ``.env`` file docker-compose.yml reads its secrets from, with fresh random values.

``make compose-env`` runs it (``python3 deploy/compose_env.py .env``); it never overwrites an
existing file (the secrets of a running stack must not change under it: a new Fernet key makes
the stored connections unreadable, a new JWT secret invalidates every token in flight). The
file is created mode 600 and is ignored by git. Standard library only.

- ``POSTGRES_PASSWORD``: Airflow's metadata DB and the live store (primary and standby);
- ``AIRFLOW_JWT_SECRET``: ``[api_auth] jwt_secret``, shared by every Airflow container: the
  scheduler signs each task's token with it, the API server's execution API checks it;
- ``AIRFLOW_FERNET_KEY``: ``[core] fernet_key`` (32 url-safe base64-encoded bytes), encrypting
  connections and variables in the metadata DB; the same in every container;
- ``AIRFLOW_API_SECRET_KEY``: ``[api] secret_key``, the API server's sessions and the tokens it
  sends to a worker's log server;
- ``RECS_API_JWT_SECRET``: the read API's token signing secret (at least 32 bytes).
"""

from __future__ import annotations

import base64
import os
import secrets
import sys
from pathlib import Path


def fresh_secrets() -> dict[str, str]:
    """Every variable docker-compose.yml requires, each a new random value."""
    return {
        "POSTGRES_PASSWORD": secrets.token_hex(16),
        "AIRFLOW_JWT_SECRET": secrets.token_urlsafe(48),
        "AIRFLOW_FERNET_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        "AIRFLOW_API_SECRET_KEY": secrets.token_urlsafe(48),
        "RECS_API_JWT_SECRET": secrets.token_hex(32),
    }


def write(path: Path) -> bool:
    """Create ``path`` (mode 600) with fresh secrets; False, changing nothing, if it exists."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "w") as env_file:
        env_file.write("# docker-compose.yml secrets (make compose-env); keep them private\n")
        env_file.writelines(f"{name}={value}\n" for name, value in fresh_secrets().items())
    return True


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".env")
    if write(target):
        print(f"wrote {target}: fresh secrets for docker-compose.yml (mode 600, not in git)")
    else:
        print(f"{target} exists: left as it is")
