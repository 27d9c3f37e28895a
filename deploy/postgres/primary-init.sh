#!/usr/bin/env bash
# Run once by the postgres image on the live store's first start (/docker-entrypoint-initdb.d):
# let the `recs` role stream WAL to the hot standby that freeze_snapshot reads
# (RECS_SNAPSHOT_STORE_URL), with the same password authentication as ordinary connections.
set -euo pipefail
echo "host replication ${POSTGRES_USER} all scram-sha-256" >> "${PGDATA}/pg_hba.conf"
