# shellcheck shell=bash
# shellcheck disable=SC2034  # the settings are used by the scripts that source this file
# Shared settings and helpers of hack/cluster/{up,down,install,uninstall} and hack/images/build.
# Sourced, never run. Every setting can be overridden by the environment.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE_DIR="${LA_STATE_DIR:-$REPO_ROOT/hack/cluster/.state}"
# What up was given (KUBE_BIN_DIR, LA_PAUSE_SRC), one KEY=value a line, so that every later
# script (node start, the fault commands, smoke, install, hack/images/build) finds them in an
# environment that lacks them, e.g. an end-to-end test's.
REMEMBERED="$STATE_DIR/remembered.env"
# remembered KEY: the value up recorded for KEY (empty if none).
remembered() {
  [[ -f $REMEMBERED ]] || return 0
  sed -n "s/^$1=//p" "$REMEMBERED" | tail -n 1
}
# Kubernetes server binaries: kube-apiserver kube-controller-manager kube-scheduler kubelet
# kube-proxy (docs/real-cluster.md says where to get them). /work/k8s/bin is only an example.
KUBE_BIN_DIR="${KUBE_BIN_DIR:-$(remembered KUBE_BIN_DIR)}"
KUBE_BIN_DIR="${KUBE_BIN_DIR:-/work/k8s/bin}"
# The pause image's source (hack/images/build pause reads LA_PAUSE_SRC).
if [[ -z ${LA_PAUSE_SRC:-} && -n "$(remembered LA_PAUSE_SRC)" ]]; then
  LA_PAUSE_SRC="$(remembered LA_PAUSE_SRC)"
  export LA_PAUSE_SRC
fi
export KUBE_BIN_DIR
# Image archives (hack/images/build); kept by down.
CACHE_DIR="${LA_CACHE_DIR:-$REPO_ROOT/hack/cluster/.cache}"
KUBECONFIG_PATH="$STATE_DIR/kubeconfig"
NODE_COUNT="${LA_NODES:-3}"
NODE_PREFIX="${LA_NODE_PREFIX:-la-node}"
# The API server's address: on its own port-less bridge (this kernel has no dummy links), only
# on this machine, reachable from the host and from every pod bridge.
API_ADDR="${LA_API_ADDR:-10.88.255.1}"
API_LINK=la-api0
API_PORT=6443
ETCD_CLIENT_PORT=23790
ETCD_PEER_PORT=23800
SERVICE_CIDR=10.96.0.0/24
SERVICE_IP=10.96.0.1
CLUSTER_CIDR=10.88.0.0/16
IMAGE_TAG="${LA_IMAGE_TAG:-dev}"
IMAGE_REPO="${LA_IMAGE_REPO:-localhost/local-activator}"
PAUSE_IMAGE="$IMAGE_REPO/pause:$IMAGE_TAG"
# The image registry (Debian's docker-registry, the CNCF distribution registry) on the API
# server's address: every node's containerd pulls from it over plain HTTP (a hosts.toml under
# each node's certs.d), hack/images/build pushes to it, the end-to-end tests pull from it.
# Its storage lives with the image cache, so pushed images survive down.
REGISTRY_PORT="${LA_REGISTRY_PORT:-5000}"
REGISTRY="$API_ADDR:$REGISTRY_PORT"
REGISTRY_REPO="$REGISTRY/local-activator"
HOSTS_MARK="# local-activator-cluster"
WAIT_TIMEOUT="${LA_WAIT_TIMEOUT:-120}"

# Per node i (1-based): name, bridge, pod subnet 10.88.i.0/24 with the host side 10.88.i.1 (also
# the node's InternalIP), kubelet port 10250+i and healthz port 10260+i on 127.0.0.1.
node_name() { echo "$NODE_PREFIX$1"; }
node_bridge() { echo "la-br$1"; }
# A fixed, locally administered MAC per bridge. A Linux bridge left to itself takes the lowest
# MAC of its ports and changes it whenever a pod's veth with a lower one comes or goes; the
# pods keep the old MAC for their gateway in their ARP caches, so their answers to the host
# (the kubelet's probes, the tests) are flooded to the other ports and lost: a node's pods
# unreachable from the host after some pod was deleted. A MAC set by hand never changes.
node_bridge_mac() { printf '02:88:00:00:%02x:01' "$1"; }
node_subnet() { echo "10.88.$1.0/24"; }
node_gw() { echo "10.88.$1.1"; }
node_port() { echo $((10250 + $1)); }
node_healthz_port() { echo $((10260 + $1)); }
node_dir() { echo "$STATE_DIR/nodes/$(node_name "$1")"; }
node_sock() { echo "$(node_dir "$1")/containerd/containerd.sock"; }

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

kc() { kubectl --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# wait_for WHAT TIMEOUT CMD...: run CMD every second until it succeeds or TIMEOUT seconds pass.
wait_for() {
  local what=$1 timeout=$2 start
  shift 2
  start=$(date +%s)
  log "waiting for $what (up to ${timeout}s)"
  until "$@" >/dev/null 2>&1; do
    if (($(date +%s) - start >= timeout)); then
      log "timed out after ${timeout}s waiting for $what (check: $*)"
      return 1
    fi
    sleep 1
  done
  log "ok: $what after $(($(date +%s) - start))s"
}

# A process this cluster started: $STATE_DIR/pids/NAME holds "PID EXE".
pid_file() { echo "$STATE_DIR/pids/$1"; }

# alive NAME: the recorded PID runs the recorded executable.
alive() {
  local f pid exe
  f=$(pid_file "$1")
  [[ -f $f ]] || return 1
  read -r pid exe <"$f"
  [[ -d /proc/$pid ]] || return 1
  [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$exe" ]]
}

# start NAME EXE ARGS...: start EXE in the background (own session, output to
# $STATE_DIR/logs/NAME.log) and record its PID, unless NAME is alive already.
start() {
  local name=$1 exe=$2
  shift 2
  if alive "$name"; then
    log "$name already running (pid $(cut -d' ' -f1 <"$(pid_file "$name")"))"
    return 0
  fi
  mkdir -p "$STATE_DIR/pids" "$STATE_DIR/logs"
  setsid "$exe" "$@" >>"$STATE_DIR/logs/$name.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid $(readlink -f "$exe")" >"$(pid_file "$name")"
  log "started $name (pid $pid, log $STATE_DIR/logs/$name.log)"
}

# start_in_ns NAME HOLDER EXE ARGS...: as start, inside the mount namespace of the process
# recorded as HOLDER (nsenter execs EXE: the recorded PID is EXE's).
start_in_ns() {
  local name=$1 holder=$2 exe=$3 hpid
  shift 3
  if alive "$name"; then
    log "$name already running (pid $(cut -d' ' -f1 <"$(pid_file "$name")"))"
    return 0
  fi
  read -r hpid _ <"$(pid_file "$holder")"
  mkdir -p "$STATE_DIR/pids" "$STATE_DIR/logs"
  setsid nsenter "--mount=/proc/$hpid/ns/mnt" -- "$exe" "$@" >>"$STATE_DIR/logs/$name.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid $(readlink -f "$exe")" >"$(pid_file "$name")"
  log "started $name (pid $pid, in the mount namespace of $holder, log $STATE_DIR/logs/$name.log)"
}

# in_cpu_group GROUP SHARES NAME: moves the process recorded as NAME (its threads, and the
# children it starts later) into the cgroup-v1 cpu group GROUP, with cpu.shares SHARES.
#
# Why: on a real node the runtime and the kubelet live in system.slice, one group beside
# kubepods.slice, whose shares are the node's allocatable CPUs (2048 on 2); here they ran in
# the root cgroup, where every one of their threads weighed as much as a node's whole pod
# group — ten image pulls (containerd decompressing and hashing) then took the CPU from the
# pods the activator serves in a way no real node allows. Each node's own: `/<node>/system`
# beside the kubelet's `/<node>/kubepods`. Idempotent (a process already there stays).
# Only cgroup v1 (what `up` sets up); elsewhere it says so and does nothing.
in_cpu_group() {
  local group=$1 shares=$2 name=$3 pid h
  read -r pid _ <"$(pid_file "$name")"
  h=/sys/fs/cgroup/cpu
  if [[ ! -f $h/cpu.shares ]]; then
    log "no cgroup-v1 cpu hierarchy: $name stays in its cgroup"
    return 0
  fi
  mkdir -p "$h/$group"
  echo "$shares" >"$h/$group/cpu.shares"
  grep -qx "$pid" "$h/$group/cgroup.procs" || echo "$pid" >"$h/$group/cgroup.procs"
}

# running PID: PID exists and is not a zombie (stopped processes are reaped by init, later).
running() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && $st != Z ]]
}

# stop NAME [TIMEOUT]: SIGTERM the recorded PID, SIGKILL after TIMEOUT seconds, forget it.
stop() {
  local name=$1 timeout=${2:-20} f pid exe i
  f=$(pid_file "$name")
  [[ -f $f ]] || return 0
  read -r pid exe <"$f"
  if alive "$name"; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 10; i++)); do
      running "$pid" || break
      sleep 0.1
    done
    if running "$pid"; then
      log "$name (pid $pid) still running after ${timeout}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
    fi
  fi
  rm -f "$f"
}

need() {
  local c
  for c in "$@"; do command -v "$c" >/dev/null 2>&1 || die "missing command: $c"; done
}

# --- the control plane's etcd and kube-apiserver (up, and hack/cluster/{etcd,api} start) -----
PKI="$STATE_DIR/pki"

# The backend quota: etcd's default (2 GiB) is what kubeadm leaves; 8 GiB is what large
# clusters set (etcd's own recommended maximum), and what `loadtest run scale --kubeconfig`
# with 100,000 revisions needs (each status write keeps a version until the API server's
# compaction, every 5 min).
start_etcd() {
  start etcd "$(command -v etcd)" --name la-etcd --data-dir "$STATE_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "la-etcd=http://127.0.0.1:$ETCD_PEER_PORT" \
    --listen-metrics-urls "" --log-level warn \
    --quota-backend-bytes "${LA_ETCD_QUOTA_BYTES:-8589934592}"
}

# wait_etcd TIMEOUT
wait_etcd() {
  wait_for "etcd /health on 127.0.0.1:$ETCD_CLIENT_PORT" "$1" \
    curl -fsS -m 2 "http://127.0.0.1:$ETCD_CLIENT_PORT/health"
}

start_apiserver() {
  [[ -x $KUBE_BIN_DIR/kube-apiserver ]] ||
    die "$KUBE_BIN_DIR/kube-apiserver missing: set KUBE_BIN_DIR (docs/real-cluster.md)"
  start kube-apiserver "$KUBE_BIN_DIR/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --bind-address "$API_ADDR" --advertise-address "$API_ADDR" --secure-port "$API_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" \
    --kubelet-preferred-address-types Hostname \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction,ServiceAccount,ValidatingAdmissionPolicy \
    --feature-gates ValidatingAdmissionPolicy=true \
    --runtime-config admissionregistration.k8s.io/v1beta1=true \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" \
    --allow-privileged=true --profiling=false --v=1
}

# wait_apiserver TIMEOUT: /readyz answers ok (etcd included).
wait_apiserver() {
  wait_for "kube-apiserver /readyz on https://$API_ADDR:$API_PORT" "$1" \
    curl -fsS -m 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://$API_ADDR:$API_PORT/readyz"
}

# --- the registry (up, hack/images/build) ---------------------------------------------------
start_registry() {
  local exe
  exe=$(command -v docker-registry || command -v registry) ||
    die "docker-registry missing (apt-get install docker-registry)"
  mkdir -p "$STATE_DIR/conf" "$CACHE_DIR/registry"
  cat >"$STATE_DIR/conf/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $CACHE_DIR/registry
  delete:
    enabled: true
http:
  addr: $REGISTRY
health:
  storagedriver:
    enabled: false
EOF
  start registry "$exe" serve "$STATE_DIR/conf/registry.yml"
}

# registry_up: the registry answers its API's base endpoint.
registry_up() { curl -fsS -m 2 -o /dev/null "http://$REGISTRY/v2/"; }

# node_arg I: checks that I names a node of this cluster.
node_arg() {
  if ! [[ $1 =~ ^[0-9]+$ ]] || (($1 < 1 || $1 > NODE_COUNT)); then
    die "no node $1 (1..$NODE_COUNT)"
  fi
}
