# minfer serve in a container: built with cargo on the official Rust image, run on Debian slim as
# an unprivileged user. The model is not in the image: mount it at /models/model.gguf
# (docker run -v), or fetch it into a shared volume first with the `fetcher` stage's image
# (docker build --target fetcher -t minfer-fetch .; deploy/kubernetes.yaml runs it as an init
# container). The README's "Serving at scale" section shows both.
#
#   docker build -t minfer .
#   docker run --rm -p 8080:8080 -v "$HOME/.cache/minfer/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf:/models/model.gguf:ro" minfer

FROM rust:1-bookworm AS build
WORKDIR /src
# Kernels are chosen at run time from the CPU's features, so one build runs on any x86-64 or
# aarch64 host; the release profile's debug info is dropped to keep the image small.
ENV CARGO_PROFILE_RELEASE_DEBUG=0
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY benches benches
RUN cargo build --release --locked --bin minfer \
    && install -D target/release/minfer /out/minfer

# The model fetcher: scripts/fetch-model.sh needs python3 with pip, which the server does not.
FROM python:3.12-slim-bookworm AS fetcher
COPY scripts/fetch-model.sh /usr/local/bin/fetch-model.sh
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /models minfer \
    && mkdir -p /models && chown minfer:minfer /models
ENV MINFER_MODELS=/models HOME=/models
USER minfer
ENTRYPOINT ["fetch-model.sh"]
CMD ["0.5b"]

FROM debian:bookworm-slim AS runtime
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /models minfer \
    && mkdir -p /models && chown minfer:minfer /models
COPY --from=build /out/minfer /usr/local/bin/minfer
ENV MINFER_MODELS=/models
USER minfer
EXPOSE 8080
# SIGTERM drains (not ready, listener closed, in-flight requests finished, exit 0); the probes
# belong on /ready (readiness) and /health (liveness).
STOPSIGNAL SIGTERM
ENTRYPOINT ["minfer", "serve"]
CMD ["/models/model.gguf", "--host", "0.0.0.0", "--port", "8080"]
