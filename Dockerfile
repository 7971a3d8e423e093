# resmon-exporter image: slim Python, non-root, NVML from the NVIDIA container runtime,
# the gpu-tracker extra for hosts where only nvidia-smi / amd-smi work, the kubernetes
# extra (grpcio, protobuf) for the kubelet PodResources socket.
# AMD GPUs are read from sysfs (--gpu.backend=amdgpu, or auto): the container's /sys is the
# host's, read-only, under Docker and Kubernetes; where it is not, mount the host's
# (-v /sys:/host/sys:ro) and pass --path.sysfs=/host/sys. No ROCm, /dev/kfd or /dev/dri needed.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility

WORKDIR /src
# exporter/ installs as the package resmon_exporter (pyproject.toml's package-dir); the
# wheel carries LICENSE (license-files), so it is copied too
COPY pyproject.toml README.md LICENSE ./
COPY exporter ./exporter
RUN pip install ".[gpu-tracker,kubernetes]" && rm -rf /src \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin resmon

USER 10001
WORKDIR /
EXPOSE 9636
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9636/-/healthy', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["resmon-exporter"]
CMD ["--web.listen-address=:9636"]
