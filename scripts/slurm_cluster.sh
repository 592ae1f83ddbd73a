#!/usr/bin/env bash
# A one-node SLURM cluster on this machine (localhost), for the live SLURM tests (tests/test_slurm_live.py) and
# for trying `+launcher=slurm` without a real cluster. Debian/Ubuntu, as root, no systemd needed.
#
#   bash scripts/slurm_cluster.sh install       # apt-get the packages where missing (exit 3 where that fails)
#   bash scripts/slurm_cluster.sh start [DIR]   # install, write the configs under DIR, start every daemon
#                                               # (exit 3: cannot install or not root; the tests then skip)
#   bash scripts/slurm_cluster.sh stop [DIR]    # cancel what is queued, wait until squeue is empty, stop all
#   bash scripts/slurm_cluster.sh env [DIR]     # the line to eval in a shell that submits: export SLURM_CONF=...
#
# DIR (default /tmp/attnres-slurm) holds everything: slurm.conf, slurmdbd.conf, the daemons' state, logs, pid files
# and a private MariaDB (accounting: without it a job that dies is never seen as failed and submitit waits forever).
# Clients find the cluster through SLURM_CONF=DIR/slurm.conf (`env` prints it). The configuration:
#   * munged as the munge user; slurmctld, slurmd and slurmdbd as root (SlurmUser=root);
#   * ProctrackType=proctrack/linuxproc and TaskPlugin=task/none (no cgroups, no systemd);
#   * one node with this machine's memory and CPUs (ATTNRES_SLURM_CPUS overrides: the tests declare 2 per core, so
#     that jobs that mostly wait run side by side; SlurmdParameters=config_overrides lets slurmd accept that);
#   * partition `debug` (the default) and `high` (PriorityTier 2: its jobs preempt `debug` jobs, which SLURM
#     requeues: PreemptType=preempt/partition_prio, PreemptMode=REQUEUE; GraceTime 30 s from SIGTERM to SIGKILL);
#   * short credential expiry and scheduler intervals (AuthInfo=cred_expire=5, sched_interval=1) so that a requeued
#     job starts again within seconds; jobs that ask for more than the node has are rejected at submission
#     (EnforcePartLimits=ALL) instead of pending forever.
# Measured on a 2-core Debian 12 VM (SLURM 22.05.8) under another job's load: install 55 s from the network; start
# 18 s on a fresh DIR (MariaDB's data directory is made), 1-4 s on an existing one; stop 8-10 s.
set -euo pipefail

PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
cmd="${1:-}"
DIR="${2:-${ATTNRES_SLURM_DIR:-/tmp/attnres-slurm}}"
DB_PORT="${ATTNRES_SLURM_DB_PORT:-33061}"
export SLURM_CONF="$DIR/slurm.conf"

die() { echo "slurm_cluster: $*" >&2; exit 1; }

install_packages() {
    local missing=()
    for bin in munged slurmctld slurmd sbatch slurmdbd mariadbd; do
        command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || missing+=("$bin")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "slurm_cluster: missing ${missing[*]} and cannot install (needs root and apt-get)" >&2
        exit 3
    fi
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" \
        >"/tmp/attnres-slurm-apt.log" 2>&1; then
        apt-get update -q >>"/tmp/attnres-slurm-apt.log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" \
            >>"/tmp/attnres-slurm-apt.log" 2>&1 || {
            echo "slurm_cluster: apt-get install ${PACKAGES[*]} failed (/tmp/attnres-slurm-apt.log)" >&2
            exit 3
        }
    fi
}

write_configs() {
    local host cpus mem_mb
    host="$(hostname -s)"
    cpus="${ATTNRES_SLURM_CPUS:-$(nproc)}"
    mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
    mkdir -p "$DIR"/{state,spool,log,run,db}
    cat >"$DIR/slurm.conf" <<EOF
ClusterName=attnres
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=5
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,sched_min_interval=100000,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
EnforcePartLimits=ALL
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
MinJobAge=5
KillWait=5
MessageTimeout=10
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
MpiDefault=none
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=30
PartitionName=high Nodes=$host MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
    cat >"$DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=attnres
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$DIR/slurmdbd.conf"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS what command...
    local limit="$1" what="$2"
    shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -ge "$end" ] && die "$what not up after ${limit}s (logs: $DIR/log)"
        sleep 0.2
    done
}

start_munge() {
    mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    if ! munge -n </dev/null >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged --force
        wait_for 10 munged sh -c 'munge -n | unmunge'
    fi
}

start_db() {
    alive "$DIR/run/mariadb.pid" && return 0
    if [ ! -d "$DIR/db/mysql" ]; then
        mariadb-install-db --user=root --datadir="$DIR/db" --auth-root-authentication-method=socket \
            --skip-test-db >"$DIR/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed"
    fi
    (setsid mariadbd --user=root --datadir="$DIR/db" --socket="$DIR/run/mysqld.sock" --port="$DB_PORT" \
        --bind-address=127.0.0.1 --pid-file="$DIR/run/mariadb.pid" --skip-log-bin --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
        --log-error="$DIR/log/mariadb.log" </dev/null >/dev/null 2>&1 &)
    wait_for 30 mariadb mariadb --socket="$DIR/run/mysqld.sock" -e "select 1"
    mariadb --socket="$DIR/run/mysqld.sock" -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; \
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'attnres'; \
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

start() {
    local t0=$SECONDS
    install_packages
    [ "$(id -u)" = 0 ] || { echo "slurm_cluster: starting the daemons needs root" >&2; exit 3; }
    write_configs
    start_munge
    start_db
    alive "$DIR/run/slurmdbd.pid" || slurmdbd
    wait_for 30 slurmdbd sacctmgr -n list cluster
    sacctmgr -i -Q add cluster attnres >/dev/null 2>&1 || true
    alive "$DIR/run/slurmctld.pid" || slurmctld
    wait_for 30 slurmctld scontrol ping
    alive "$DIR/run/slurmd.pid" || slurmd -N "$(hostname -s)"
    wait_for 30 "the node" sh -c "sinfo -h -N -o %t | grep -qE '^(idle|mix|alloc)'"
    echo "slurm_cluster: up in $((SECONDS - t0)) s (SLURM_CONF=$SLURM_CONF)"
}

stop_pid() {  # stop_pid PIDFILE: SIGTERM, then wait (SIGKILL after 15 s)
    local file="$1" pid
    alive "$file" || return 0
    pid="$(cat "$file")"
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 75); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
}

stop() {
    local t0=$SECONDS
    [ -f "$SLURM_CONF" ] || { echo "slurm_cluster: no cluster under $DIR"; return 0; }
    if alive "$DIR/run/slurmctld.pid"; then
        scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        local end=$((SECONDS + 30))
        while [ -n "$(squeue -h -o %i 2>/dev/null)" ] && [ "$SECONDS" -lt "$end" ]; do sleep 0.3; done
    fi
    stop_pid "$DIR/run/slurmd.pid"
    stop_pid "$DIR/run/slurmctld.pid"
    stop_pid "$DIR/run/slurmdbd.pid"
    stop_pid "$DIR/run/mariadb.pid"
    echo "slurm_cluster: stopped in $((SECONDS - t0)) s"
}

case "$cmd" in
    install) install_packages ;;
    start) start ;;
    stop) stop ;;
    env) echo "export SLURM_CONF=$SLURM_CONF" ;;
    *) echo "usage: $0 install|start|stop|env [DIR]" >&2; exit 2 ;;
esac
