"""The demo: the real exporter on a simulated machine, for a laptop or VM without a GPU.

`scripts/demo.sh [h100|mig|amd|intel]` (or `python -m demo ...` from the repository root)
builds the fake libnvidia-ml.so.1 with gcc (or writes a fake sysfs tree), starts the exporter
on it and moves the values every few seconds. Every value is simulated.

The simulation is the test rig's, not a copy of it: the fake NVML's C source
(tests/fake_nvml/), its scenario file (tests/fakenvml.py's build_fake, Scenario, gpu_keys),
the GPU boards (tests/scenarios.py), the fake sysfs trees (tests/fake_sysfs.py,
tests/fake_intel.py) and the GPU's processes and pods (tests/gpu_users.py, with the fake
kubelet of tests/fake_kubelet.py). `rig` puts tests/ on the import path. That is why the demo
runs from a clone (or from the compose `demo` image, whose build copies exactly these files),
not from the installed package.
"""
