"""Marketing names of Intel GPUs by PCI device id (the kernel gives none: no product_name).

A short built-in table of the boards people run as compute or media GPUs, then the system's
pci.ids (Debian's pci.ids package, hwdata elsewhere), then "Intel GPU [8086:xxxx]".
"""

from __future__ import annotations

PCI_IDS_FILES = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids")

KNOWN: dict[str, str] = {
    # Arc Alchemist (DG2), i915 (xe since 6.8 with force_probe)
    "56a0": "Intel Arc A770 Graphics", "56a1": "Intel Arc A750 Graphics", "56a2": "Intel Arc A580 Graphics",
    "56a5": "Intel Arc A380 Graphics", "56a6": "Intel Arc A310 Graphics",
    "5690": "Intel Arc A770M Graphics", "5691": "Intel Arc A730M Graphics", "5692": "Intel Arc A550M Graphics",
    # Data Center GPU Flex (ATS-M), i915
    "56c0": "Intel Data Center GPU Flex 170", "56c1": "Intel Data Center GPU Flex 140",
    # Data Center GPU Max (Ponte Vecchio), xe (i915 out of tree)
    "0bd5": "Intel Data Center GPU Max 1550", "0bda": "Intel Data Center GPU Max 1100",
    # Arc Battlemage (BMG), xe
    "e20b": "Intel Arc B580 Graphics", "e20c": "Intel Arc B570 Graphics",
    # integrated Xe
    "7d55": "Intel Arc Graphics (Meteor Lake)", "7dd5": "Intel Graphics (Meteor Lake)",
    "64a0": "Intel Arc Graphics 130V / 140V (Lunar Lake)",
    "46a6": "Intel Iris Xe Graphics (Alder Lake)", "a7a0": "Intel Iris Xe Graphics (Raptor Lake)",
    "9a49": "Intel Iris Xe Graphics (Tiger Lake)",
}


def from_pci_ids(text: str, device: str) -> str | None:
    """The device line of vendor 8086 in a pci.ids file ("\\t56a0  DG2 [Arc A770]")."""
    in_intel = False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            in_intel = line.startswith("8086 ")
            continue
        if in_intel and not line.startswith("\t\t"):
            ident, _, name = line.strip().partition(" ")
            if ident.lower() == device:
                return f"Intel {name.strip()}"
    return None


def gpu_name(pci_id: str, pci_ids_files: tuple[str, ...] = PCI_IDS_FILES) -> str:
    """pci_id: uevent's PCI_ID, "8086:56A0"."""
    device = pci_id.partition(":")[2].lower()
    if device in KNOWN:
        return KNOWN[device]
    for path in pci_ids_files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                name = from_pci_ids(f.read(), device)
        except OSError:
            continue
        if name:
            return name
    return f"Intel GPU [{pci_id.lower() or 'unknown'}]"
