"""Kubernetes attribution: which pod and container holds each GPU.

podresources asks the kubelet's PodResources v1 API (grpc and protobuf are imported only when
it is called), deviceids turns the device plugins' id strings into GPU identities, podlogs names
pods by UID from the kubelet's log directory.
"""
