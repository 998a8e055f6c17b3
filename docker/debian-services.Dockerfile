# Redis and Prometheus from Debian's packages, for hosts without an image registry
# (scripts/compose-airgapped.sh builds them on its debootstrapped base and tags them under the names
# docker-compose.yml pulls: they take the same command, volumes and healthcheck).
#   docker build --network host --target redis -f docker/debian-services.Dockerfile <empty dir>
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS redis
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/*
# As the official image: data in /data, reachable from the compose network (Debian's default protected
# mode refuses clients from other hosts when no password is set; the network is the boundary here).
WORKDIR /data
ENTRYPOINT ["/bin/sh", "-c", "if [ \"$1\" = redis-server ]; then exec \"$@\" --protected-mode no; fi; exec \"$@\"", "redis"]
CMD ["redis-server"]
EXPOSE 6379

FROM ${BASE} AS prometheus
# wget: the compose healthcheck's probe.
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus /etc/prometheus
WORKDIR /prometheus
# As the official image: compose's command is the server's arguments.
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
EXPOSE 9090
