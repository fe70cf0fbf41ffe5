#!/usr/bin/env bash
# make e2e-local: the e2e suite against the current KUBECONFIG and EC2_ENDPOINT (default: moto on
# loopback), with the operator run as local processes under its ServiceAccount's identity.
# With KUBEBUILDER_ASSETS set and KUBECONFIG unset, it starts a real control plane of its own
# from the binaries there (testkit's `control-plane`: etcd, kube-apiserver, kube-controller-manager)
# and stops it on exit.
# Portable bash (Linux, macOS): no GNU-only flags.
set -euo pipefail

die() {
  printf 'error: %s\n' "$*" >&2
  exit 2
}
# Own control plane: KUBEBUILDER_ASSETS set, KUBECONFIG not (the envtest convention).
OWN_CONTROL_PLANE=""
if [ -z "${KUBECONFIG:-}" ] && [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  OWN_CONTROL_PLANE=1
  for bin in etcd kube-apiserver kube-controller-manager kubectl; do
    [ -x "$KUBEBUILDER_ASSETS/$bin" ] || die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no $bin"
  done
  # Its kubectl matches its API server.
  PATH=$KUBEBUILDER_ASSETS:$PATH
fi
# Every tool this script calls, checked before anything is created.
missing=""
for tool in kubectl cargo curl python3 base64 chmod cat date mkdir rm sleep; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
[ -z "$missing" ] || die "make e2e-local needs:$missing (not found in PATH; see e2e/README.md)"

case "${BASH_SOURCE[0]}" in
  */*) HERE=${BASH_SOURCE[0]%/*} ;;
  *) HERE=. ;;
esac
ROOT=$(cd "$HERE/.." && pwd)
cd "$ROOT"
WORK=${E2E_WORK_DIR:-$ROOT/e2e/.work}
NS=${E2E_NAMESPACE:-eni-operator}
SA=${E2E_SERVICE_ACCOUNT:-eni-operator}
LEASE=${E2E_LEASE_NAME:-eni-operator}
# A fresh cluster name per run: ENIs left by an earlier run against the same endpoint are not ours.
CLUSTER_NAME=${E2E_CLUSTER_NAME:-e2e-$(date +%s)}
CRD=${E2E_CRD:-ours}
case "$CRD" in ours|cilium|keep) ;; *) echo "E2E_CRD must be ours, cilium or keep (got: $CRD)" >&2; exit 2 ;; esac
export AWS_REGION=${AWS_REGION:-us-east-1}
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test}
export AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
mkdir -p "$WORK"

log() { printf '==> %s\n' "$*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

MOTO_PID=""
CP_PID=""
cleanup() {
  local rc=$?
  log "cleaning up"
  if [ -n "$CP_PID" ]; then
    # The whole control plane goes: nothing in it to clean.
    kill "$CP_PID" 2>/dev/null || true
    wait "$CP_PID" 2>/dev/null || true
    if [ -n "$MOTO_PID" ]; then kill "$MOTO_PID" 2>/dev/null || true; fi
    if [ -n "${EC2_SIM_PID:-}" ]; then kill "$EC2_SIM_PID" 2>/dev/null || true; fi
    exit "$rc"
  fi
  kubectl delete nodes -l eni-operator-e2e/run --wait=false --ignore-not-found >/dev/null 2>&1 || true
  # Nodes left draining by an interrupted `draining-node` (only the suite puts finalizers on them).
  for n in $(kubectl get nodes -l eni-operator-e2e/run -o name 2>/dev/null); do
    kubectl patch "$n" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  done
  # CiliumNodes whose finalizer nobody will remove any more (the operators are gone by now).
  for cn in $(kubectl get ciliumnodes -l eni-operator-e2e/run -o name 2>/dev/null); do
    kubectl patch "$cn" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    kubectl delete "$cn" --wait=false --ignore-not-found >/dev/null 2>&1 || true
  done
  if [ -n "$MOTO_PID" ]; then kill "$MOTO_PID" 2>/dev/null || true; fi
  if [ -n "${EC2_SIM_PID:-}" ]; then kill "$EC2_SIM_PID" 2>/dev/null || true; fi
  exit "$rc"
}
trap cleanup EXIT INT TERM

# One build for the whole workspace, with the features `make test` unifies (`--bins -p ...`
# alone resolves tokio & co. differently and rebuilds most dependencies a second time).
BUILT=""
# E2E_PREBUILT=1: the caller built it already (CI runs several of these side by side: a cargo
# call each would wait on the others' lock on the build directory).
[ -z "${E2E_PREBUILT:-}" ] || BUILT=1
build() {
  [ -z "$BUILT" ] || return 0
  log "building"
  cargo build --quiet --locked --workspace --all-targets
  BUILT=1
}

if [ -n "$OWN_CONTROL_PLANE" ]; then
  build
  CP_KUBECONFIG=$WORK/control-plane.kubeconfig
  rm -f "$CP_KUBECONFIG"
  log "starting a control plane from KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS (log: $WORK/control-plane.log)"
  "$CARGO_TARGET_DIR/debug/control-plane" --kubeconfig "$CP_KUBECONFIG" >"$WORK/control-plane.log" 2>&1 &
  CP_PID=$!
  tries=0
  until [ -s "$CP_KUBECONFIG" ]; do
    kill -0 "$CP_PID" 2>/dev/null || { CP_PID=""; cat "$WORK/control-plane.log" >&2; die "the control plane did not start (log above)"; }
    tries=$((tries + 1))
    [ "$tries" -lt "${E2E_CONTROL_PLANE_TIMEOUT:-300}" ] || die "the control plane is not ready after ${E2E_CONTROL_PLANE_TIMEOUT:-300}s ($WORK/control-plane.log)"
    sleep 1
  done
  export KUBECONFIG=$CP_KUBECONFIG
  log "control plane ready (KUBECONFIG=$KUBECONFIG)"
fi

kubectl get --raw /readyz >/dev/null 2>&1 || die "no API server reachable through KUBECONFIG"

# E2E_EC2=sim: ec2-sim (the test simulator on the wire, AWS's rules and throttling) instead of
# moto; E2E_EC2_SIM_ARGS adds its flags (see docs/emulators.md).
EC2_SIM_PID=""
case "${E2E_EC2:-moto}" in moto|sim) ;; *) die "E2E_EC2 must be moto or sim (got: $E2E_EC2)" ;; esac
if [ -z "${EC2_ENDPOINT:-}" ] && [ "${E2E_EC2:-moto}" = sim ]; then
  build
  rm -f "$WORK/ec2-sim.addr"
  # shellcheck disable=SC2086 # the extra flags are meant to split
  "$CARGO_TARGET_DIR/debug/ec2-sim" --listen 127.0.0.1:0 ${E2E_EC2_SIM_ARGS:-} \
    >"$WORK/ec2-sim.addr" 2>"$WORK/ec2-sim.log" &
  EC2_SIM_PID=$!
  tries=0
  until [ -s "$WORK/ec2-sim.addr" ]; do
    kill -0 "$EC2_SIM_PID" 2>/dev/null || { cat "$WORK/ec2-sim.log" >&2; die "ec2-sim exited (log above)"; }
    tries=$((tries + 1))
    [ "$tries" -lt 60 ] || die "ec2-sim printed no address after 30s ($WORK/ec2-sim.log)"
    sleep 0.5
  done
  read -r EC2_ENDPOINT <"$WORK/ec2-sim.addr"
  log "ec2-sim on $EC2_ENDPOINT"
fi
if [ -z "${EC2_ENDPOINT:-}" ]; then
  if [ ! -x .venv/bin/moto_server ]; then
    log "creating .venv with moto[server]"
    python3 -m venv .venv
    .venv/bin/pip install --quiet "moto[server]==${MOTO_VERSION:-5.2.5}"
  fi
  PORT=$(free_port)
  .venv/bin/moto_server -H 127.0.0.1 -p "$PORT" >"$WORK/moto.log" 2>&1 &
  MOTO_PID=$!
  EC2_ENDPOINT=http://127.0.0.1:$PORT
  tries=0
  until curl -fsS -o /dev/null "$EC2_ENDPOINT/moto-api/" 2>/dev/null; do
    kill -0 "$MOTO_PID" 2>/dev/null || { cat "$WORK/moto.log" >&2; die "moto exited (log above)"; }
    tries=$((tries + 1))
    [ "$tries" -lt 60 ] || die "moto is not answering on $EC2_ENDPOINT after 30s ($WORK/moto.log)"
    sleep 0.5
  done
  log "moto on $EC2_ENDPOINT"
fi
export EC2_ENDPOINT

build
E2E=$CARGO_TARGET_DIR/debug/eni-operator-e2e
export ENI_OPERATOR_BIN=${ENI_OPERATOR_BIN:-$CARGO_TARGET_DIR/debug/eni-operator}

log "applying namespace, ServiceAccount and RBAC from manifests/"
"$E2E" filter-manifests --kinds Namespace,ServiceAccount,ClusterRole,ClusterRoleBinding,Role,RoleBinding \
  manifests/*.yaml >"$WORK/rbac.yaml"
kubectl apply -f "$WORK/rbac.yaml"
# Which CiliumNode CRD the suite runs against (E2E_CRD, see e2e/README.md):
#   ours (default)  manifests/crd/: preserves unknown fields;
#   cilium          Cilium's own (tests/fixtures/ciliumnodes.cilium.io.yaml), as real clusters
#                   run it: the API server prunes every field it does not list;
#   keep            whatever the cluster has (e.g. a cluster running Cilium).
# ours and cilium create the CRD, or replace the one installed (replace, not apply: a merge
# with an earlier CRD could keep x-kubernetes-preserve-unknown-fields).
case "$CRD" in
  ours)
    cp manifests/crd/ciliumnodes.cilium.io.yaml "$WORK/crd.yaml" ;;
  cilium)
    cp tests/fixtures/ciliumnodes.cilium.io.yaml "$WORK/crd.yaml" ;;
  keep)
    kubectl get crd ciliumnodes.cilium.io >/dev/null \
      || { echo "E2E_CRD=keep but the cluster has no ciliumnodes.cilium.io CRD" >&2; exit 2; } ;;
esac
if [ "$CRD" != keep ]; then
  if kubectl get crd ciliumnodes.cilium.io >/dev/null 2>&1; then
    log "replacing the CiliumNode CRD with $CRD's"
    kubectl replace -f "$WORK/crd.yaml"
  else
    log "installing $CRD's CiliumNode CRD"
    kubectl create -f "$WORK/crd.yaml"
  fi
fi
kubectl wait --for condition=established crd/ciliumnodes.cilium.io --timeout=60s
# The README's install command against this cluster's CRD (Cilium's or ours): a server-side
# dry run that must pass and leave the CRD untouched.
bash scripts/check-install.sh
# A lease left by an earlier run would only delay the first leader.
kubectl -n "$NS" delete lease "$LEASE" --ignore-not-found >/dev/null

log "writing a kubeconfig for ServiceAccount $NS/$SA"
TOKEN=$(kubectl create token "$SA" -n "$NS" --duration=3h)
SERVER=$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')
CA_DATA=$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
CA_FILE=$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')
INSECURE=$(kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.insecure-skip-tls-verify}')
SA_KUBECONFIG=$WORK/operator.kubeconfig
rm -f "$SA_KUBECONFIG"
if [ -n "$CA_DATA" ]; then
  printf '%s' "$CA_DATA" | base64 --decode >"$WORK/ca.crt"
  kubectl config --kubeconfig="$SA_KUBECONFIG" set-cluster e2e --server="$SERVER" \
    --certificate-authority="$WORK/ca.crt" --embed-certs=true >/dev/null
elif [ -n "$CA_FILE" ]; then
  kubectl config --kubeconfig="$SA_KUBECONFIG" set-cluster e2e --server="$SERVER" \
    --certificate-authority="$CA_FILE" --embed-certs=true >/dev/null
else
  kubectl config --kubeconfig="$SA_KUBECONFIG" set-cluster e2e --server="$SERVER" \
    --insecure-skip-tls-verify="${INSECURE:-false}" >/dev/null
fi
kubectl config --kubeconfig="$SA_KUBECONFIG" set-credentials "$SA" --token="$TOKEN" >/dev/null
kubectl config --kubeconfig="$SA_KUBECONFIG" set-context e2e --cluster=e2e --user="$SA" --namespace="$NS" >/dev/null
kubectl config --kubeconfig="$SA_KUBECONFIG" use-context e2e >/dev/null
chmod 600 "$SA_KUBECONFIG"
[ "$(kubectl --kubeconfig="$SA_KUBECONFIG" auth can-i list ciliumnodes.cilium.io)" = yes ] \
  || { echo "the ServiceAccount cannot list ciliumnodes: RBAC in manifests/ is incomplete" >&2; exit 1; }
export E2E_OPERATOR_KUBECONFIG=$SA_KUBECONFIG E2E_WORK_DIR=$WORK E2E_LEASE_NAME=$LEASE

log "running the suite (cluster name $CLUSTER_NAME, EC2 $EC2_ENDPOINT, CiliumNode CRD: $CRD)"
"$E2E" run --cluster-name "$CLUSTER_NAME" --namespace "$NS" --service-account "$SA" "$@"
