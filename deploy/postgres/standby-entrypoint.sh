#!/usr/bin/env bash
# The live store's hot standby: on first start, copy the primary with pg_basebackup
# (--write-recovery-conf: standby.signal + primary_conninfo), then run as a read-only replica
# that replays the primary's WAL as it streams. A dedicated snapshot standby: hot_standby_feedback
# keeps vacuum on the primary from cancelling a long snapshot read, and
# max_standby_streaming_delay=-1 makes replay wait for the read rather than cancel it on a lock
# conflict (recs.testing.pgserver.start_standby runs the same setup locally).
set -euo pipefail
if [ ! -s "${PGDATA}/PG_VERSION" ]; then
    until pg_isready -h "${PRIMARY_HOST}" -U "${POSTGRES_USER}"; do sleep 2; done
    PGPASSWORD="${POSTGRES_PASSWORD}" pg_basebackup -h "${PRIMARY_HOST}" -U "${POSTGRES_USER}" \
        -D "${PGDATA}" --write-recovery-conf --wal-method=stream --checkpoint=fast
    chmod 700 "${PGDATA}"
fi
exec postgres -c hot_standby=on -c hot_standby_feedback=on -c max_standby_streaming_delay=-1
