# kvgate gateway image: the core install, the gateway only.
#   docker build -t kvgate:0.1.0 .
# EXTRAS adds optional extras from pyproject.toml; the CPU-only stack (docker-compose.cpu.yml) builds
# kvgate:<version>-lab with EXTRAS=sim,bench so the same image also runs `kvgate sim` and `kvgate bench`.
#   docker build --build-arg EXTRAS=sim,bench -t kvgate:0.1.0-lab .
# Two stages: the build stage installs the project into a virtualenv; the final stage copies only
# that virtualenv onto a slim Python, so no compiler, pip cache or source tree ships.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/kvgate
WORKDIR /src
# Dependencies first, from pyproject alone, so a source change does not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir app && touch app/__init__.py \
 && /opt/kvgate/bin/pip install ".${EXTRAS:+[$EXTRAS]}" \
 && /opt/kvgate/bin/pip uninstall -y kvgate
COPY app ./app
RUN /opt/kvgate/bin/pip install --no-deps . \
 && /opt/kvgate/bin/pip uninstall -y pip setuptools wheel \
 && find /opt/kvgate -name '__pycache__' -prune -exec rm -rf {} + \
 && /opt/kvgate/bin/python -m compileall -q /opt/kvgate/lib

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kvgate" \
      org.opencontainers.image.description="OpenAI-compatible gateway for self-hosted vLLM" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/kvgate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    KVGATE_CONFIG=/etc/kvgate/gateway.yaml
RUN groupadd --system --gid 10001 kvgate \
 && useradd --system --uid 10001 --gid kvgate --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kvgate
COPY --from=build /opt/kvgate /opt/kvgate
# A default config so the image runs on its own; compose mounts config/gateway.yaml over it.
COPY config/gateway.yaml /etc/kvgate/gateway.yaml
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=3)"]
CMD ["kvgate", "serve", "--config", "/etc/kvgate/gateway.yaml"]
