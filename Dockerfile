# lockedjob-operator image: `docker build -t lockedjob-operator .`
# Stage 1 builds dependencies in a layer of their own (cached until Cargo.toml/Cargo.lock
# change), then the project. Stage 2 holds only the binary and CA certificates, non-root.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# The workspace's other members (test support and dev tools, never built here) only need their
# manifests and empty targets; tests/image.rs checks this list against Cargo.toml.
COPY localcluster/Cargo.toml localcluster/
COPY quickstart/Cargo.toml quickstart/
RUN for member in localcluster quickstart; do \
      mkdir -p "$member/src" \
      && touch "$member/src/lib.rs" \
      && echo 'fn main() {}' > "$member/src/main.rs"; \
    done
# Empty targets with the real manifest: `cargo build` compiles and caches every dependency.
RUN mkdir -p src benches \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && echo 'fn main() {}' > benches/redlock.rs \
 && echo 'fn main() {}' > benches/operator.rs \
 && cargo build --release --locked --bin lockedjob \
 && rm -rf src benches
COPY src ./src
COPY benches ./benches
# Touch so cargo sees the real sources as newer than the cached empty targets.
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked --bin lockedjob \
 && cp target/release/lockedjob /lockedjob

# distroless/cc: glibc, libgcc and CA certificates (rediss:// and the API server use rustls
# with the system roots), no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /lockedjob /usr/local/bin/lockedjob
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/lockedjob"]
CMD ["operator"]
