# syntax=docker/dockerfile:1.7
#
# One image with the three binaries: gpuwarden-agent (DaemonSet), gpuwarden-controller
# (Deployment) and the gpuwarden CLI. Build: docker build -t ghcr.io/gpuwarden/gpuwarden:0.1.0 .
#
# Debian bookworm, as on the dev and CI machines: bookworm-security carries rustc-web 1.96 (with
# the prebuilt `core` for bpfel-unknown-none that the eBPF programs build with) and LLVM 22 (for
# bpf-linker). The runtime stage uses the same release, so the binaries find the glibc they were
# linked against.

ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE}-slim AS builder
# rustup's stable builds the user-space crates (rust-version 1.95); Debian's /usr/bin/rustc
# builds the eBPF object inside agent/build.rs.
ARG RUST_VERSION=1.95.0
ENV DEBIAN_FRONTEND=noninteractive \
    RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# What `cargo xtask setup` would install, in a layer of its own so that a source change does not
# redo it: the eBPF toolchain (rustc-web, libstd-rust-web-dev-bpf, LLVM 22 for bpf-linker), a C
# toolchain to link, and the test-time tools setup also checks for (fuse3, python3-venv).
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends \
      ca-certificates curl gcc libc6-dev \
      rustc-web libstd-rust-web-dev-bpf \
      llvm-22-dev libpolly-22-dev libzstd-dev zlib1g-dev \
      fuse3 python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*

RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
      | sh -s -- -y --no-modify-path --profile minimal --default-toolchain "${RUST_VERSION}" \
 && rustc --version && cargo --version

RUN LLVM_PREFIX=/usr/lib/llvm-22 \
    cargo install bpf-linker --locked --no-default-features --features llvm-22

WORKDIR /src
COPY . .

# The project's own setup: finds everything above in place (and only adds the Python environment
# of the manifest validator under target/). It fails the build if the eBPF toolchain is unusable.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo xtask setup

RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p gpuwarden-agent -p gpuwarden-controller -p gpuwarden-cli \
 && mkdir -p /out \
 && cp target/release/gpuwarden-agent target/release/gpuwarden-controller \
       target/release/gpuwarden /out/


FROM debian:${DEBIAN_RELEASE}-slim AS runtime
# ca-certificates for an https:// controller or collector. Nothing GPU-specific: NVML
# (libnvidia-ml.so.1) is loaded at run time from the host driver, injected by the NVIDIA
# Container Toolkit (see deploy/kubernetes/agent.yaml).
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/gpuwarden/controller /run/gpuwarden \
 && chown 65532:65532 /var/lib/gpuwarden/controller

COPY --from=builder /out/ /usr/local/bin/

LABEL org.opencontainers.image.title="gpuwarden" \
      org.opencontainers.image.description="eBPF GPU-sharing node agent, controller and CLI" \
      org.opencontainers.image.source="https://github.com/gpuwarden/gpuwarden" \
      org.opencontainers.image.licenses="Apache-2.0"

# Non-root by default (the controller and the CLI need nothing more); the agent's DaemonSet runs
# it as root, privileged.
USER 65532:65532
EXPOSE 50051
# Both binaries shut down cleanly (the controller closing its store) on SIGINT or SIGTERM.
# Mutual TLS from files mounted at /etc/gpuwarden/tls: the controller refuses plain text on a
# non-loopback address unless told --insecure.
CMD ["gpuwarden-controller", "run", "--listen", "0.0.0.0:50051", \
     "--tls-cert", "/etc/gpuwarden/tls/tls.crt", "--tls-key", "/etc/gpuwarden/tls/tls.key", \
     "--tls-client-ca", "/etc/gpuwarden/tls/ca.crt"]
