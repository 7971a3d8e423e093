"""What the DRM backends (amdgpu, intel) share: sysfs error boundary, card discovery, DRM client usage stats."""
