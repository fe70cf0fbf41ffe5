#!/usr/bin/env bash
# make e2e: an EC2 emulator (LocalStack, or moto with E2E_EC2=moto) + a kind cluster + the
# operator image loaded into kind, the kustomize base (manifests/*.yaml) applied with
# e2e/overlay, then the suite in in-cluster mode. Everything it creates is removed on exit
# (E2E_KEEP=1 keeps it). Portable bash (Linux, macOS): no GNU-only flags.
set -euo pipefail

die() {
  printf 'error: %s\n' "$*" >&2
  exit 2
}

# Every tool this script calls, checked before anything is created.
missing=""
for tool in docker kind kubectl cargo curl cat cp grep mkdir mktemp rm sed sleep; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
[ -z "$missing" ] || die "make e2e needs:$missing (not found in PATH; see e2e/README.md)"

E2E_EC2=${E2E_EC2:-localstack}
case "$E2E_EC2" in
  localstack)
    # 4.14.0 is the last LocalStack release that starts without an account: later ones (and
    # :latest since March 2026) exit at start unless LOCALSTACK_AUTH_TOKEN is set.
    EMULATOR_IMAGE=${LOCALSTACK_IMAGE:-localstack/localstack:4.14.0}
    EMULATOR_PORT=4566
    HEALTH_PATH=/_localstack/health
    ;;
  moto)
    # moto's server image; the tests pin the same version (Makefile MOTO_VERSION).
    EMULATOR_IMAGE=${MOTO_IMAGE:-motoserver/moto:${MOTO_VERSION:-5.2.5}}
    EMULATOR_PORT=5000
    HEALTH_PATH=/moto-api/
    ;;
  *) die "E2E_EC2 must be localstack or moto, not '$E2E_EC2'" ;;
esac
E2E_CRD=${E2E_CRD:-ours}
case "$E2E_CRD" in
  ours | cilium) ;;
  *) die "E2E_CRD must be ours or cilium, not '$E2E_CRD'" ;;
esac

docker info >/dev/null 2>&1 \
  || die "the Docker engine is not reachable ('docker info' failed): start Docker or fix DOCKER_HOST"

case "${BASH_SOURCE[0]}" in
  */*) HERE=${BASH_SOURCE[0]%/*} ;;
  *) HERE=. ;;
esac
ROOT=$(cd "$HERE/.." && pwd -P)
cd "$ROOT"
WORK=$ROOT/e2e/.work/kind
KIND_CLUSTER=${KIND_CLUSTER:-eni-operator-e2e}
IMAGE=eni-operator:e2e
EMULATOR=${E2E_EMULATOR_NAME:-eni-operator-e2e-$E2E_EC2}
HOST_PORT=${E2E_EMULATOR_HOST_PORT:-4566}
EMULATOR_TIMEOUT=${E2E_EMULATOR_TIMEOUT:-120}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
export AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
mkdir -p "$WORK"

log() { printf '==> %s\n' "$*" >&2; }

OVERLAY=""
cleanup() {
  local rc=$?
  log "cleaning up"
  if [ "${E2E_KEEP:-}" != 1 ]; then
    kind delete cluster --name "$KIND_CLUSTER" >/dev/null 2>&1 || true
    docker rm -f "$EMULATOR" >/dev/null 2>&1 || true
  fi
  if [ -n "$OVERLAY" ]; then rm -rf "$OVERLAY"; fi
  exit "$rc"
}
trap cleanup EXIT INT TERM

# The emulator first: it takes seconds, a kind cluster takes minutes, so a bad image or a
# missing token fails before the slow part.
log "starting $E2E_EC2 ($EMULATOR_IMAGE) on 127.0.0.1:$HOST_PORT"
docker rm -f "$EMULATOR" >/dev/null 2>&1 || true
emulator_env=(-e SERVICES=ec2)
# `-e NAME` without a value passes the variable from this environment: the token never shows
# up in the command line.
if [ -n "${LOCALSTACK_AUTH_TOKEN:-}" ]; then emulator_env+=(-e LOCALSTACK_AUTH_TOKEN); fi
docker run -d --name "$EMULATOR" "${emulator_env[@]}" \
  -p "127.0.0.1:$HOST_PORT:$EMULATOR_PORT" "$EMULATOR_IMAGE" >/dev/null \
  || die "could not start $EMULATOR_IMAGE (is port $HOST_PORT free? set E2E_EMULATOR_HOST_PORT)"

healthy() {
  local body
  body=$(curl -fsS "http://127.0.0.1:$HOST_PORT$HEALTH_PATH" 2>/dev/null) || return 1
  case "$E2E_EC2" in
    localstack) printf '%s' "$body" | grep -Eq '"ec2": *"(available|running)"' ;;
    moto) return 0 ;;
  esac
}
waited=0
until healthy; do
  if [ "$(docker inspect -f '{{.State.Running}}' "$EMULATOR" 2>/dev/null)" != true ]; then
    docker logs --tail 30 "$EMULATOR" >&2 2>&1 || true
    die "the $E2E_EC2 container ($EMULATOR_IMAGE) exited (logs above). LocalStack after 4.14 needs LOCALSTACK_AUTH_TOKEN; or try E2E_EC2=moto"
  fi
  if [ "$waited" -ge "$EMULATOR_TIMEOUT" ]; then
    docker logs --tail 30 "$EMULATOR" >&2 2>&1 || true
    die "$E2E_EC2 is not healthy after ${EMULATOR_TIMEOUT}s (http://127.0.0.1:$HOST_PORT$HEALTH_PATH; logs above)"
  fi
  sleep 1
  waited=$((waited + 1))
done
log "$E2E_EC2 is healthy"

log "creating kind cluster $KIND_CLUSTER"
# Two workers: the Deployment uses host networking (host ports), so the two replicas of the
# failover scenario need two schedulable nodes.
cat >"$WORK/kind.yaml" <<'KIND'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
  - role: worker
KIND
kind create cluster --name "$KIND_CLUSTER" --config "$WORK/kind.yaml" --wait 180s
export KUBECONFIG=$WORK/kubeconfig
kind get kubeconfig --name "$KIND_CLUSTER" >"$KUBECONFIG"

# kind created the `kind` network; the operator's pods reach the emulator there.
docker network connect kind "$EMULATOR"
EMULATOR_IP=$(docker inspect -f '{{(index .NetworkSettings.Networks "kind").IPAddress}}' "$EMULATOR")
[ -n "$EMULATOR_IP" ] || die "$EMULATOR has no address on the kind network"
OPERATOR_EC2=http://$EMULATOR_IP:$EMULATOR_PORT
log "$E2E_EC2 at $OPERATOR_EC2 on the kind network"

log "building and loading the image"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$KIND_CLUSTER"
cargo build --quiet --bin eni-operator-e2e -p eni-operator-e2e
E2E=$CARGO_TARGET_DIR/debug/eni-operator-e2e

# kind runs no Cilium, so the CiliumNode CRD comes from here: ours (manifests/crd/), or with
# E2E_CRD=cilium the copy of Cilium's own (tests/fixtures/), as on a cluster that runs Cilium.
if [ "$E2E_CRD" = cilium ]; then
  log "installing Cilium's CiliumNode CRD (tests/fixtures/ciliumnodes.cilium.io.yaml)"
  kubectl apply -f tests/fixtures/ciliumnodes.cilium.io.yaml
else
  log "installing the CiliumNode CRD from manifests/crd/"
  kubectl apply -f manifests/crd/
fi
kubectl wait --for condition=established crd/ciliumnodes.cilium.io --timeout=60s

# The README's install command against the CRD already there: it must apply and leave the CRD
# alone (the same check users can run on a cluster with Cilium).
bash scripts/check-install.sh

log "applying the kustomize base with the e2e overlay"
# kustomize refuses a base that contains its overlay (the root contains e2e/), so the overlay
# is rendered from a copy outside the repository that names the root by a relative path.
OVERLAY=$(mktemp -d "${TMPDIR:-/tmp}/eni-operator-e2e.XXXXXX")
OVERLAY=$(cd "$OVERLAY" && pwd -P)
up="" dir=$OVERLAY
while [ -n "$dir" ]; do
  up="../$up"
  dir=${dir%/*}
done
cp e2e/overlay/deployment-patch.yaml "$OVERLAY/"
sed "s|^  - \.\./\.\.\$|  - $up${ROOT#/}|" e2e/overlay/kustomization.yaml >"$OVERLAY/kustomization.yaml"
kubectl kustomize "$OVERLAY" | sed "s|@EC2_ENDPOINT@|$OPERATOR_EC2|" >"$WORK/rendered.yaml"
grep -q -- "--ec2-api-endpoint=$OPERATOR_EC2" "$WORK/rendered.yaml" \
  || die "the rendered overlay does not set the EC2 endpoint ($WORK/rendered.yaml)"
crd_version=$(kubectl get crd ciliumnodes.cilium.io -o jsonpath='{.metadata.resourceVersion}')
kubectl apply -f "$WORK/rendered.yaml"
[ "$(kubectl get crd ciliumnodes.cilium.io -o jsonpath='{.metadata.resourceVersion}')" = "$crd_version" ] \
  || die "installing the operator modified the ciliumnodes CRD"

log "running the suite in in-cluster mode"
"$E2E" run --in-cluster --cluster-name e2e \
  --ec2-endpoint "http://127.0.0.1:$HOST_PORT" \
  --operator-ec2-endpoint "$OPERATOR_EC2" "$@"
