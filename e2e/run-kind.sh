#!/usr/bin/env bash
# make e2e: kind cluster + LocalStack on the kind network + the operator image loaded into kind,
# manifests/ applied with e2e/overlay, then the same suite in in-cluster mode. Needs docker, kind,
# kubectl, cargo. Everything it creates is removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
WORK=$ROOT/e2e/.work/kind
KIND_CLUSTER=${KIND_CLUSTER:-eni-operator-e2e}
IMAGE=eni-operator:e2e
LOCALSTACK=${LOCALSTACK_NAME:-eni-operator-e2e-localstack}
LOCALSTACK_IMAGE=${LOCALSTACK_IMAGE:-localstack/localstack:latest}
LOCALSTACK_PORT=${LOCALSTACK_PORT:-4566}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
export AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
mkdir -p "$WORK"

log() { printf '==> %s\n' "$*" >&2; }
for tool in docker kind kubectl cargo; do
  command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 2; }
done

cleanup() {
  local rc=$?
  log "cleaning up"
  if [ "${E2E_KEEP:-}" != 1 ]; then
    kind delete cluster --name "$KIND_CLUSTER" >/dev/null 2>&1 || true
    docker rm -f "$LOCALSTACK" >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap cleanup EXIT INT TERM

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

log "starting LocalStack on the kind network"
docker rm -f "$LOCALSTACK" >/dev/null 2>&1 || true
docker run -d --name "$LOCALSTACK" --network kind -e SERVICES=ec2 \
  -p "127.0.0.1:$LOCALSTACK_PORT:4566" "$LOCALSTACK_IMAGE" >/dev/null
for _ in $(seq 1 120); do
  curl -fsS "http://127.0.0.1:$LOCALSTACK_PORT/_localstack/health" 2>/dev/null | grep -q '"ec2": *"\(available\|running\)"' && break
  sleep 1
done
LOCALSTACK_IP=$(docker inspect -f '{{(index .NetworkSettings.Networks "kind").IPAddress}}' "$LOCALSTACK")
log "LocalStack at $LOCALSTACK_IP (host port $LOCALSTACK_PORT)"

log "building and loading the image"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$KIND_CLUSTER"
cargo build --quiet --bin eni-operator-e2e -p eni-operator-e2e
E2E=$CARGO_TARGET_DIR/debug/eni-operator-e2e

log "applying manifests/ with the e2e overlay"
rm -rf "$WORK/overlay" && cp -r e2e/overlay "$WORK/overlay"
mkdir -p "$WORK/overlay/base"
cp manifests/*.yaml "$WORK/overlay/base/"
if [ ! -f "$WORK/overlay/base/kustomization.yaml" ]; then
  # List the files first: the redirection would otherwise create kustomization.yaml in the glob.
  files=$(cd "$WORK/overlay/base" && ls ./*.yaml)
  { echo "resources:"; for f in $files; do echo "  - $(basename "$f")"; done; } \
    >"$WORK/overlay/base/kustomization.yaml"
fi
sed -i "s|@EC2_ENDPOINT@|http://$LOCALSTACK_IP:4566|" "$WORK/overlay/deployment-patch.yaml"
kubectl kustomize "$WORK/overlay" >"$WORK/rendered.yaml"
# The CRD first, so the rest never races its establishment.
"$E2E" filter-manifests --kinds CustomResourceDefinition "$WORK/rendered.yaml" | kubectl apply -f -
kubectl wait --for condition=established crd/ciliumnodes.cilium.io --timeout=60s
kubectl apply -f "$WORK/rendered.yaml"

log "running the suite in in-cluster mode"
"$E2E" run --in-cluster --cluster-name e2e \
  --ec2-endpoint "http://127.0.0.1:$LOCALSTACK_PORT" \
  --operator-ec2-endpoint "http://$LOCALSTACK_IP:4566" "$@"
