# syntax=docker/dockerfile:1
# eni-operator image: `make image` (or `docker build -t eni-operator .`).
# Multi-arch from this one file: `docker buildx build --platform linux/amd64,linux/arm64 .`
# runs the builder stage once per target platform (arm64 under QEMU on an amd64 host), so no
# cross-compiler is needed; rust:*-slim and distroless/cc are published for both.

FROM rust:1.95-slim-bookworm AS builder
WORKDIR /src

# 1. Dependencies only, cached until a Cargo.toml or Cargo.lock changes: build the binary once
#    against placeholder sources for every workspace member (cargo needs them all to load the
#    workspace), including any target path a member's manifest names explicitly.
#    Every member listed in the root Cargo.toml's `members` needs its manifest here.
COPY Cargo.toml Cargo.lock ./
COPY bench/Cargo.toml bench/Cargo.toml
COPY crd-gen/Cargo.toml crd-gen/Cargo.toml
COPY dst/Cargo.toml dst/Cargo.toml
COPY e2e/Cargo.toml e2e/Cargo.toml
COPY testkit/Cargo.toml testkit/Cargo.toml
RUN set -eu; \
    for member in . bench crd-gen dst e2e testkit; do \
        mkdir -p "$member/src"; \
        echo 'fn main() {}' > "$member/src/main.rs"; \
        : > "$member/src/lib.rs"; \
        for target in $(sed -n 's/^path *= *"\(.*\.rs\)"/\1/p' "$member/Cargo.toml"); do \
            mkdir -p "$member/$(dirname "$target")"; \
            echo 'fn main() {}' > "$member/$target"; \
        done; \
    done; \
    cargo build --locked --release -p eni-operator --bin eni-operator; \
    rm -rf src bench/src crd-gen/src dst/src e2e/src testkit/src \
        target/release/eni-operator* \
        target/release/.fingerprint/eni-operator-* \
        target/release/deps/eni_operator-* \
        target/release/deps/libeni_operator-*

# 2. The real sources: only eni-operator itself is compiled here.
COPY . .
RUN cargo build --locked --release -p eni-operator --bin eni-operator \
    && cp target/release/eni-operator /eni-operator

# Runtime: glibc + CA certificates, no shell, uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /eni-operator /usr/local/bin/eni-operator
USER nonroot
EXPOSE 9751 9752
ENTRYPOINT ["/usr/local/bin/eni-operator"]
