#!/usr/bin/env bash
# The eni-operator image, built and run on this machine without a Docker daemon and without
# pulling anything (docs: README "The image"):
#   scripts/image.sh binaries   static release binaries for linux/amd64 and linux/arm64:
#                               rustup targets *-unknown-linux-musl, cargo-zigbuild + zig
#   scripts/image.sh build      Containerfile -> one OCI image index with both platforms
#                               (buildah, --timestamp 0: the same digest every run), written to
#                               $IMAGE_ARCHIVE (an oci-archive)
#   scripts/image.sh smoke      runs both images with podman + runc (arm64 under qemu-user):
#                               `--version` names this version, `plan --help` answers
#   scripts/image.sh all        the three in order (`make image image-smoke`)
# IMAGE_ARCHS="amd64" (default "amd64 arm64") limits every step to those architectures.
# Each step checks its tools first and names the package that provides a missing one.
set -euo pipefail

die() {
  printf 'error: %s\n' "$*" >&2
  exit 2
}
log() { printf '==> %s\n' "$*" >&2; }

case "${BASH_SOURCE[0]}" in
  */*) HERE=${BASH_SOURCE[0]%/*} ;;
  *) HERE=. ;;
esac
ROOT=$(cd "$HERE/.." && pwd)
cd "$ROOT"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$TARGET_DIR/image
CONTEXT=$WORK/context
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
[ -n "$VERSION" ] || die "no version in Cargo.toml"
IMAGE_NAME=${IMAGE_NAME:-eni-operator}
IMAGE_ARCHIVE=${IMAGE_ARCHIVE:-$WORK/eni-operator-v$VERSION.oci.tar}
# buildah's and podman's storage inside the work tree, not the system's.
STORAGE=(--storage-driver vfs --root "$WORK/storage" --runroot "$WORK/run")
# Rust target -> image architecture.
TARGETS=(x86_64-unknown-linux-musl:amd64 aarch64-unknown-linux-musl:arm64)

# The architectures to build and run: IMAGE_ARCHS (space-separated), both by default.
IMAGE_ARCHS=${IMAGE_ARCHS:-amd64 arm64}
wanted() { case " $IMAGE_ARCHS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# `linux/amd64,linux/arm64` for buildah's --platform, in TARGETS' order.
platforms() {
  local t out=""
  for t in "${TARGETS[@]}"; do
    wanted "${t#*:}" && out="$out${out:+,}linux/${t#*:}"
  done
  [ -n "$out" ] || die "IMAGE_ARCHS=\"$IMAGE_ARCHS\" names neither amd64 nor arm64"
  printf '%s' "$out"
}

need() {
  local missing=""
  for tool in "$@"; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing="$missing ${tool%%:*} (${tool#*:})"
  done
  [ -z "$missing" ] || die "missing:$missing"
}

binaries() {
  need rustup:rustup cargo-zigbuild:'pip install cargo-zigbuild'
  # zig itself, or the ziglang package of the python3 in PATH (cargo-zigbuild runs either).
  command -v zig >/dev/null 2>&1 || python3 -c 'import ziglang' 2>/dev/null \
    || die "missing: zig (pip install ziglang)"
  # IMAGE_ARCHS=amd64 builds one (CI's budget fits one release cross-build: README "The image").
  local t start
  for t in "${TARGETS[@]}"; do
    wanted "${t#*:}" || continue
    rustup target add "${t%%:*}" >/dev/null
    # One target per cargo run: each build's time is its own figure.
    log "cargo zigbuild --release --target ${t%%:*}"
    start=$SECONDS
    cargo zigbuild --locked --release -p eni-operator --bin eni-operator --target "${t%%:*}"
    log "${t#*:} cross build took $((SECONDS - start))s"
    mkdir -p "$CONTEXT/bin/${t#*:}"
    cp "$TARGET_DIR/${t%%:*}/release/eni-operator" "$CONTEXT/bin/${t#*:}/eni-operator"
  done
}

rootfs() {
  local certs=${CA_CERTIFICATES:-/etc/ssl/certs/ca-certificates.crt}
  [ -s "$certs" ] || die "no CA bundle at $certs (apt-get install ca-certificates, or set CA_CERTIFICATES)"
  mkdir -p "$CONTEXT/rootfs/etc/ssl/certs"
  cp "$certs" "$CONTEXT/rootfs/etc/ssl/certs/ca-certificates.crt"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$CONTEXT/rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$CONTEXT/rootfs/etc/group"
}

build() {
  need buildah:'apt-get install buildah'
  for t in "${TARGETS[@]}"; do
    wanted "${t#*:}" || continue
    [ -x "$CONTEXT/bin/${t#*:}/eni-operator" ] || die "no ${t#*:} binary: run $0 binaries first"
  done
  rootfs
  local name=localhost/$IMAGE_NAME:v$VERSION platform
  platform=$(platforms)
  buildah "${STORAGE[@]}" manifest rm "$name" >/dev/null 2>&1 || true
  # Both by default: --platform linux/amd64,linux/arm64.
  log "buildah build --platform $platform --manifest $name"
  buildah "${STORAGE[@]}" build --timestamp 0 --platform "$platform" \
    --manifest "$name" -f Containerfile "$CONTEXT"
  rm -f "$IMAGE_ARCHIVE"
  buildah "${STORAGE[@]}" manifest push --all --format oci "$name" "oci-archive:$IMAGE_ARCHIVE:v$VERSION"
  log "image index: $IMAGE_ARCHIVE ($(du -h "$IMAGE_ARCHIVE" | cut -f1))"
  if command -v skopeo >/dev/null 2>&1; then
    skopeo inspect --raw "oci-archive:$IMAGE_ARCHIVE" | grep -o '"architecture":"[a-z0-9]*"' >&2 || true
  fi
}

smoke() {
  need podman:'apt-get install podman' runc:'apt-get install runc'
  [ -s "$IMAGE_ARCHIVE" ] || die "no image at $IMAGE_ARCHIVE: run $0 build first"
  local arch out help
  for arch in $IMAGE_ARCHS; do
    local run=(podman "${STORAGE[@]}" --runtime runc --cgroup-manager cgroupfs run --rm
      --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024
      --platform "linux/$arch" "oci-archive:$IMAGE_ARCHIVE")
    out=$("${run[@]}" --version) || die "linux/$arch: --version failed (arm64 needs qemu-user-static with binfmt_misc)"
    [ "$out" = "eni-operator $VERSION" ] || die "linux/$arch: --version said: $out"
    # Captured, not piped into `grep -q`: grep's early exit broke podman's pipe (pipefail).
    help=$("${run[@]}" plan --help) || die "linux/$arch: plan --help failed"
    case "$help" in *--cluster-name*) ;; *) die "linux/$arch: plan --help names no --cluster-name" ;; esac
    log "linux/$arch: $out; plan --help answers"
  done
}

case "${1:-all}" in
  binaries) binaries ;;
  build) build ;;
  smoke) smoke ;;
  all) binaries; build; smoke ;;
  *) die "usage: $0 binaries|build|smoke|all" ;;
esac
