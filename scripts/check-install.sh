#!/usr/bin/env bash
# Checks that the README's install command is safe on the cluster of the current KUBECONFIG,
# typically one that runs Cilium: `kubectl apply -f manifests/` passes a server-side dry run,
# contains no CustomResourceDefinition, and leaves the ciliumnodes CRD (Cilium's or ours) as it
# was. It creates the eni-operator Namespace if absent (the install's first object: namespaced
# objects cannot be dry-run into a namespace that does not exist); nothing else is written.
# Usage: scripts/check-install.sh [MANIFESTS_DIR]   (e2e/run-kind.sh runs it too)
set -euo pipefail

die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}
log() { printf '==> %s\n' "$*" >&2; }

missing=""
for tool in kubectl grep; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
[ -z "$missing" ] || die "check-install needs:$missing"

case "${BASH_SOURCE[0]}" in
  */*) HERE=${BASH_SOURCE[0]%/*} ;;
  *) HERE=. ;;
esac
DIR=${1:-$HERE/../manifests}
[ -d "$DIR" ] || die "$DIR is not a directory"

kubectl get --raw /readyz >/dev/null 2>&1 || die "no API server reachable through KUBECONFIG"

crd_version() {
  kubectl get crd ciliumnodes.cilium.io -o jsonpath='{.metadata.resourceVersion}{" "}{.metadata.labels.io\.cilium\.k8s\.crd\.schema\.version}' 2>/dev/null || true
}
before=$(crd_version)
if [ -z "$before" ]; then
  log "no ciliumnodes CRD on this cluster: Cilium installs it; without Cilium apply $DIR/crd/ first"
fi

if ! kubectl get namespace eni-operator >/dev/null 2>&1; then
  log "creating the eni-operator namespace (the install's first object)"
  kubectl apply -f "$DIR/01-namespace.yaml" >/dev/null
fi

log "kubectl apply --dry-run=server -f $DIR"
objects=$(kubectl apply --dry-run=server -f "$DIR" -o name) \
  || die "kubectl apply --dry-run=server -f $DIR failed (above)"
if printf '%s\n' "$objects" | grep -qi 'customresourcedefinition'; then
  die "the default apply path contains a CRD: $(printf '%s\n' "$objects" | grep -i customresourcedefinition)"
fi
[ "$(crd_version)" = "$before" ] || die "the ciliumnodes CRD changed during the check"
count=$(printf '%s\n' "$objects" | grep -c .)
log "ok: $count objects apply cleanly; no CRD among them; the ciliumnodes CRD is untouched"
