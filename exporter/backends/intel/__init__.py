"""Intel GPUs (xe and i915 drivers) from sysfs, hwmon and DRM client usage stats: backend.py."""
