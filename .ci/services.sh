#!/usr/bin/env bash
# Makes sure PostgreSQL, Redis and a Redis Cluster run and answer on 127.0.0.1 before the store
# tests, installing them from Debian's packages on a machine that has none, and that the official
# Python MCP SDK the MCP-over-HTTP tests drive the server with is in target/mcp-venv. Safe to run
# again. Exports nothing: the tests use their default URLs, postgres://postgres@127.0.0.1:5432/test,
# redis://127.0.0.1:6379 and the cluster's nodes redis://127.0.0.1:7000 to 7005, and their default
# Python, target/mcp-venv/bin/python.
set -euo pipefail

PG_HOST=127.0.0.1
PG_USER=postgres
PG_DB=test
REDIS_HOST=127.0.0.1
REDIS_PORT=6379
WAIT_SECONDS=30

log() { echo "services: $*" >&2; }
fail() {
    echo "services: ERROR: $*" >&2
    exit 1
}

apt_updated=
install() {
    if [ -z "$apt_updated" ]; then
        apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Runs "$@" until it succeeds, for at most WAIT_SECONDS; fails naming $what otherwise.
wait_for() {
    local what=$1
    shift
    local i
    for ((i = 0; i < WAIT_SECONDS * 4; i++)); do
        if "$@" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.25
    done
    fail "$what did not answer on 127.0.0.1 within ${WAIT_SECONDS}s"
}

pg_ready() { pg_isready -h "$PG_HOST" -q; }
pg_sql() { psql -h "$PG_HOST" -U "$PG_USER" -d postgres -v ON_ERROR_STOP=1 -tAc "$1"; }
redis_ready() { [ "$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]; }

# --- PostgreSQL ---------------------------------------------------------------------------------
installed_pg=
if ! command -v pg_ctlcluster >/dev/null || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
    log "PostgreSQL is not installed: installing it"
    install postgresql
    installed_pg=1
fi
if ! pg_ready; then
    version=$(ls /etc/postgresql | head -1)
    log "starting PostgreSQL $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start ||
        log "pg_ctlcluster could not start the cluster (it may be starting already)"
fi
wait_for PostgreSQL pg_ready

if ! pg_sql "SELECT 1" >/dev/null 2>&1; then
    if [ -n "$installed_pg" ]; then
        # A fresh Debian install asks for a password over TCP; the tests connect as postgres
        # without one, as on the machines this project runs on.
        version=$(ls /etc/postgresql | head -1)
        hba=/etc/postgresql/$version/main/pg_hba.conf
        log "allowing $PG_USER to connect from $PG_HOST without a password ($hba)"
        sed -i "1i host all all $PG_HOST/32 trust" "$hba"
        pg_ctlcluster --skip-systemctl-redirect "$version" main reload
        wait_for "PostgreSQL (as $PG_USER, no password)" pg_sql "SELECT 1"
    else
        fail "PostgreSQL answers but refuses user $PG_USER from $PG_HOST without a password; \
allow it in pg_hba.conf or set TOOLKEY_POSTGRES_URL for the tests"
    fi
fi

if [ "$(pg_sql "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != 1 ]; then
    log "creating database $PG_DB"
    pg_sql "CREATE DATABASE \"$PG_DB\"" >/dev/null
fi

# --- Redis --------------------------------------------------------------------------------------
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    log "Redis is not installed: installing it"
    install redis-server
fi
if ! redis_ready; then
    log "starting Redis on $REDIS_HOST:$REDIS_PORT"
    redis-server --daemonize yes --bind "$REDIS_HOST" --port "$REDIS_PORT" --save "" --appendonly no
fi
wait_for Redis redis_ready

# --- Redis Cluster -------------------------------------------------------------------------------
# Three masters with one replica each, for the cluster store's tests. Failover is quick
# (cluster-node-timeout 1 s) so the failover test's window is short, and a replica takes over
# however long it was cut off from its master. The tests stop and kill masters; a node that is
# not running is started again here with its old nodes file, and rejoins as a replica.
CLUSTER_PORTS=(7000 7001 7002 7003 7004 7005)
CLUSTER_DIR=${TOOLKEY_REDIS_CLUSTER_DIR:-/tmp/toolkey-redis-cluster}
node_ready() { [ "$(redis-cli -h "$REDIS_HOST" -p "$1" ping 2>/dev/null)" = PONG ]; }
cluster_ok() {
    local port
    for port in "${CLUSTER_PORTS[@]}"; do
        redis-cli -h "$REDIS_HOST" -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
        # Every node sees all six, and each master has its replica.
        [ "$(redis-cli -h "$REDIS_HOST" -p "$port" cluster nodes 2>/dev/null |
            awk '$3 !~ /fail/ && $8 == "connected"' | wc -l)" = 6 ] || return 1
    done
    [ "$(redis-cli -h "$REDIS_HOST" -p "${CLUSTER_PORTS[0]}" cluster nodes | awk '$3 ~ /master/' | wc -l)" = 3 ]
}
for port in "${CLUSTER_PORTS[@]}"; do
    if ! node_ready "$port"; then
        mkdir -p "$CLUSTER_DIR/$port"
        log "starting Redis Cluster node on $REDIS_HOST:$port"
        redis-server --daemonize yes --bind "$REDIS_HOST" --port "$port" --dir "$CLUSTER_DIR/$port" \
            --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 1000 \
            --cluster-replica-validity-factor 0 --save "" --appendonly no \
            --logfile "$CLUSTER_DIR/$port/redis.log" --pidfile "$CLUSTER_DIR/$port/redis.pid"
    fi
done
for port in "${CLUSTER_PORTS[@]}"; do
    wait_for "Redis Cluster node $port" node_ready "$port"
done
if [ "$(redis-cli -h "$REDIS_HOST" -p "${CLUSTER_PORTS[0]}" cluster info | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')" = 1 ]; then
    log "creating the Redis Cluster (3 masters, 1 replica each)"
    redis-cli --cluster create $(printf "$REDIS_HOST:%s " "${CLUSTER_PORTS[@]}") \
        --cluster-replicas 1 --cluster-yes >/dev/null
fi
wait_for "Redis Cluster (cluster_state:ok on every node)" cluster_ok

# --- The Python MCP SDK -------------------------------------------------------------------------
# Pinned: the tests read what this version's client prints and how it reports a refusal.
MCP_SDK='mcp==2.3.0'
venv="$(cd "$(dirname "$0")/.." && pwd)/target/mcp-venv"
if ! "$venv/bin/python" -c 'import mcp.client.streamable_http' >/dev/null 2>&1 ||
    [ "$("$venv/bin/python" -m pip show mcp 2>/dev/null | sed -n 's/^Version: //p')" != "${MCP_SDK#mcp==}" ]; then
    command -v python3 >/dev/null || install python3
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
        install python3-venv
        python3 -m venv "$venv"
    fi
    log "installing the Python MCP SDK ($MCP_SDK) into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$MCP_SDK"
fi
"$venv/bin/python" -c 'import mcp.client.streamable_http' ||
    fail "the Python MCP SDK ($MCP_SDK) does not import from $venv"

log "PostgreSQL ($PG_HOST:5432, database $PG_DB), Redis ($REDIS_HOST:$REDIS_PORT), Redis Cluster \
($REDIS_HOST:${CLUSTER_PORTS[0]}-${CLUSTER_PORTS[5]}) and the Python MCP SDK are ready"
