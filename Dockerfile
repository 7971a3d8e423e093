# resmon-exporter image: slim Python, a non-root uid, the exporter and the extras named by
# EXTRAS. Build it from the repository root with the tag the manifests pull
# (docs/kubernetes.md, "Image": `docker build -t <registry>/resmon-exporter:<version> .`, or
# `podman build`). The build reads this repository only: the exporter is installed from the
# copied source (.dockerignore sends nothing else), and pip reaches the package index for the
# dependencies; nothing is cloned or downloaded otherwise.
#
# EXTRAS, comma-separated extras of pyproject.toml:
#   kubernetes (the default): grpcio and protobuf, the kubernetes collector's kubelet
#     PodResources client (which pod holds which GPU); without it the collector cannot read
#     the kubelet's socket.
#   gpu-tracker: the fallback backend for hosts where only nvidia-smi / amd-smi work. It pulls
#     pandas and SQLAlchemy, about 190 MB against 7 MB for the exporter, hence off by default:
#     `docker build --build-arg EXTRAS=kubernetes,gpu-tracker ...`.
#   empty (`--build-arg EXTRAS=`): the exporter alone.
#
# NVML comes from the NVIDIA container runtime (the two NVIDIA_ variables below).
# AMD GPUs are read from sysfs (--gpu.backend=amdgpu, or auto): the container's /sys is the
# host's, read-only, under Docker and Kubernetes; where it is not, mount the host's
# (-v /sys:/host/sys:ro) and pass --path.sysfs=/host/sys. No ROCm, /dev/kfd or /dev/dri needed.
#
# No HEALTHCHECK: Kubernetes ignores it and probes /-/healthy and /-/ready itself
# (deploy/kubernetes/base/daemonset.yaml), and a check baked in here would fix the port and
# scheme that --web.listen-address and --web.config.file change. docker-compose.yml has its own.
#
# The base is pinned by digest (python:3.12-slim's multi-platform index), so a rebuild gets the
# same system. To move it on, print the tag's current index digest and put it after the @:
#   docker buildx imagetools inspect python:3.12-slim    (the "Digest:" line)
#   crane digest python:3.12-slim
FROM python:3.12-slim@sha256:78387bc3881b8273120a12ebe6c1ab22b018ccc2c9adf565ae1ac9b536e184ea

ARG EXTRAS=kubernetes

LABEL org.opencontainers.image.title="resmon-exporter" \
      org.opencontainers.image.description="Prometheus exporter for GPU (NVML, amdgpu) and host resources" \
      org.opencontainers.image.source="https://github.com/resmon-exporter/resmon-exporter" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility

WORKDIR /src
# exporter/ installs as the package resmon_exporter (pyproject.toml's package-dir); the
# wheel carries LICENSE (license-files) and README.md (readme), so they are copied too
COPY pyproject.toml README.md LICENSE ./
COPY exporter ./exporter
# ".[a,b]", or "." where EXTRAS is empty
RUN pip install ".${EXTRAS:+[$EXTRAS]}" && rm -rf /src

# uid and gid 65532 (distroless' "nonroot"), as the non-root Kubernetes component runs it;
# numeric, so Kubernetes' runAsNonRoot can check it. Deliberately without an /etc/passwd
# entry and outside the uids hosts give people (1000-60000, LDAP from 10000) and system
# accounts: the `user` label of process series is looked up in the container's passwd, and
# an account of ours there named every host process of that uid (10001 was one) after us.
# Host user names appear only when the host's passwd (or NSS) is mounted (docs/metrics.md).
USER 65532:65532
WORKDIR /
# the CLI's default listen address (:9636); no CMD: flags given to `docker run` or the
# manifests' args are the exporter's own
EXPOSE 9636
ENTRYPOINT ["resmon-exporter"]
