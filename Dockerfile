# Container images of mooncake-core (docs/kubernetes.md). Not built in CI (no container engine
# there); tests/deploy/test_kubernetes.py checks that what it copies exists and that the
# manifests' images are its targets.
#   docker build -t mooncake-core:0.1.0 .                     mooncake_master, mooncake_proxy,
#                                                             mooncake_doctor, the store node
#   docker build --target vllm -t mooncake-core-vllm:0.1.0 .  vLLM (CUDA) with our connectors
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0

# ------------------------------------------------------------------ the package's sources
FROM ${PYTHON_IMAGE} AS src
WORKDIR /src
COPY pyproject.toml README.md ./
COPY mooncake_core mooncake_core
COPY mooncake_proxy mooncake_proxy
COPY mooncake_connectors mooncake_connectors

# ------------------------------------------------------------------ services
FROM ${PYTHON_IMAGE} AS core
# iproute2: `ip route` for mooncake_doctor's address checks
RUN apt-get update && apt-get install -y --no-install-recommends iproute2 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=src /src /tmp/mooncake-src
RUN pip install --no-cache-dir "/tmp/mooncake-src[etcd,redis,kv-events,fast]" && rm -rf /tmp/mooncake-src
RUN useradd --uid 10001 --create-home mooncake
USER 10001
WORKDIR /home/mooncake
CMD ["mooncake_master", "--help"]

# ------------------------------------------------------------------ vLLM with our connectors
FROM ${VLLM_IMAGE} AS vllm
COPY --from=src /src /tmp/mooncake-src
# no dependency resolution against vLLM's pinned stack: ours are small and already satisfied
# there except msgspec/pluggy/sortedcontainers/regex, installed explicitly
RUN pip install --no-cache-dir msgspec pluggy sortedcontainers regex "etcd3gw>=2.4" "redis>=5" \
    && pip install --no-cache-dir --no-deps /tmp/mooncake-src && rm -rf /tmp/mooncake-src
ENTRYPOINT []
CMD ["vllm", "serve", "--help"]
