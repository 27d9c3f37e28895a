"""``[core] hostname_callable`` for the Celery test's workers: the name in ``WORKER_HOSTNAME``.

Airflow records on each task instance the host that ran it (``get_hostname()``, by default the
machine's FQDN). The test's two Celery workers run on one machine, so by default both would
record the same name; each worker process is started with ``WORKER_HOSTNAME`` set to its own
``--celery-hostname`` and this callable, so the metadata DB says which worker ran each task.
On separate machines the default (the FQDN) already tells them apart.
"""

from __future__ import annotations

import os


def hostname() -> str:
    return os.environ["WORKER_HOSTNAME"]
