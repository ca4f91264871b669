# HAProxy from Debian's package, on the same base as attnserve's image (no container registry
# needed; deploy/compose-replicas.yml builds it). The config is mounted from
# deploy/replicas/haproxy.cfg; the addresses come from the environment.
ARG DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log
USER haproxy
STOPSIGNAL SIGUSR1
ENTRYPOINT ["/usr/sbin/haproxy", "-db", "-f", "/etc/haproxy/haproxy.cfg"]
