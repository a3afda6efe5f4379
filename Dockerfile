# lockedjob-operator image: `docker build -t lockedjob-operator .`, or without a Docker engine
# `scripts/image.sh` (buildah, as root; tests/kubernetes/image.rs builds it so on every CI run).
# Stage 1 builds dependencies in a layer of their own (cached until Cargo.toml/Cargo.lock
# change), then the project. Stage 2 holds only the binary and CA certificates, non-root.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY redlock/Cargo.toml redlock/
COPY localcluster/Cargo.toml localcluster/
COPY quickstart/Cargo.toml quickstart/
COPY testsupport/Cargo.toml testsupport/
# Empty targets with the real manifests: `cargo build` compiles and caches every dependency.
# The lock engine (redlock) gets its sources below; the other members (test support and dev
# tools) and the benches (which cargo wants to find, as the manifest names them) are never
# built and keep these stubs, so editing them does not rebuild the dependencies.
RUN for member in localcluster quickstart testsupport; do \
      mkdir -p "$member/src" \
      && touch "$member/src/lib.rs" \
      && echo 'fn main() {}' > "$member/src/main.rs"; \
    done \
 && mkdir -p src redlock/src benches \
 && for bench in redlock operator elect; do echo 'fn main() {}' > "benches/$bench.rs"; done \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs redlock/src/lib.rs \
 && cargo build --release --locked --bin lockedjob
COPY redlock/src ./redlock/src
COPY src ./src
# Touch so cargo sees the real sources as newer than the cached empty targets.
RUN touch src/main.rs src/lib.rs redlock/src/lib.rs \
 && cargo build --release --locked --bin lockedjob

# distroless/cc: glibc, libgcc and CA certificates (rediss:// and the API server use rustls
# with the system roots), no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/lockedjob /usr/local/bin/lockedjob
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/lockedjob"]
CMD ["operator"]
