"""The one place that turns sysfs reads into what the exporter does about them (amdgpu and intel).

Every attribute of the amdgpu and intel backends is read through read(), and every value parsed by
the helpers below, so the errno policy lives here and nowhere else:

- the card is gone (its device directory vanished, or the driver answers one of the
  backend's gone errnos): Gone, and the backend reports the card down (resmon_gpu_up 0,
  kept under its last index). amdgpu (GONE_ERRNOS): ENODEV / ENXIO, unplugged, "no such
  device". intel (INTEL_GONE_ERRNOS): ENODEV, and EIO, which i915 and xe answer for every
  file of a wedged GPU; not ENXIO, their power firmware's refusal of one request (a
  power1_max on Battlemage): that value only;
- anything else that fails, for one attribute only: None, an absent series. ENOENT (the
  file does not exist on this board: no fan, no edge sensor on MI300), EOPNOTSUPP /
  EINVAL / ENODATA (the SMU has no such sensor), EPERM / EACCES / EBUSY / EAGAIN (the
  GPU is runtime-suspended or in reset: newer kernels answer EPERM rather than waking it),
  EIO / ETIMEDOUT (amdgpu: one SMU message failed), ENXIO (intel), text that is not a number and a number out of
  range (sysfs values are u64: more than 20 digits, or 2**64 and over, is garbage, and
  would otherwise overflow a float in the exposition): one odd answer never takes a
  working card down, and is never exported as 0.

A read that blocks (a hung SMU) is not handled here: each card is read on a thread of its
own (drm/readers.py) with the refresh deadline, so it downs that card alone.
"""

from __future__ import annotations

import errno
import os
import re

# sysfs attributes are at most one page
_PAGE = 4096
# u64, the widest sysfs number: "18446744073709551615" is 20 digits
_MAX_DIGITS = 20
_U64_LIMIT = 2**64
# The driver says the device itself is gone.
GONE_ERRNOS = frozenset({errno.ENODEV, errno.ENXIO})
# i915 and xe answer EIO for every attribute of a wedged GPU (a failed reset): the card is
# down, not one value absent (amdgpu's EIO is one failed SMU message: that value only); their
# ENXIO is the power firmware refusing one request, not a missing device
INTEL_GONE_ERRNOS = frozenset({errno.ENODEV, errno.EIO})


class Gone(Exception):
    """The directory owning the attribute vanished (a card unplugged, a KFD process that
    exited), or the driver says it has no such device."""


def read(path: str, owner: str, gone: frozenset[int] = GONE_ERRNOS) -> str | None:
    """The text of one sysfs attribute, stripped; None when it cannot be used (see the
    module docstring). owner: the directory the attribute belongs to (the card's PCI device
    directory), checked on ENOENT to tell a missing file from a card that disappeared;
    gone: the errnos that mean the whole card is down (GONE_ERRNOS, INTEL_GONE_ERRNOS)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        _classify(exc, owner, gone)
        return None
    try:
        data = os.read(fd, _PAGE)
    except OSError as exc:
        _classify(exc, owner, gone)
        return None
    finally:
        os.close(fd)
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:  # garbage: that attribute only
        return None


def listdir(path: str, owner: str | None = None, gone: frozenset[int] = GONE_ERRNOS) -> list[str] | None:
    """A directory's entries; None when it does not exist or cannot be listed. With
    owner, a vanished owner raises Gone as read() does."""
    try:
        return os.listdir(path)
    except OSError as exc:
        if owner is not None:
            _classify(exc, owner, gone)
        return None


def link_name(path: str) -> str | None:
    """The last part of a symlink's target (a device's driver); None where there is none."""
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _classify(exc: OSError, owner: str, gone: frozenset[int]) -> None:
    if exc.errno in gone:
        raise Gone(f"{owner}: {os.strerror(exc.errno or 0)}") from None
    if exc.errno == errno.ENOENT and not os.path.isdir(owner):
        raise Gone(f"{owner}: vanished") from None
    # everything else: that attribute is absent this refresh


def integer(text: str | None) -> int | None:
    """A decimal integer attribute (bytes, microwatts, millidegrees, hertz, percent); None
    for garbage. Negative values are garbage too: none of these files can be negative; so
    is anything a u64 cannot hold (checked on the length first: no int() of a page of digits)."""
    if text is None:
        return None
    text = text.strip()
    if not text.isascii() or not text.isdecimal() or len(text) > _MAX_DIGITS:
        return None
    value = int(text)
    return value if value < _U64_LIMIT else None


def percent_ratio(text: str | None) -> float | None:
    """gpu_busy_percent / mem_busy_percent as 0..1; older kernels can report values over 100
    (the driver clamps only since 2024): those are dropped, not clamped into a false 100 %."""
    value = integer(text)
    return value / 100.0 if value is not None and value <= 100 else None


def scaled(text: str | None, divisor: float) -> float | None:
    value = integer(text)
    return value / divisor if value is not None else None


# "1: 1000Mhz *" (the current level is starred); RDNA also lists a sleep level "S: 19Mhz"
_DPM_LINE = re.compile(r"\s*(?P<level>\d+|S):\s*(?P<mhz>\d+)\s*[Mm][Hh][Zz]\s*(?P<current>\*)?\s*")


def dpm_levels(text: str | None) -> tuple[float | None, float | None]:
    """(current, highest) clock in hertz from a pp_dpm_sclk / pp_dpm_mclk table; None for
    what it does not say. A line that does not parse makes the table garbage."""
    if not text:
        return None, None
    current = highest = None
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _DPM_LINE.fullmatch(line)
        if match is None:
            return None, None
        mhz = integer(match["mhz"])
        if mhz is None:  # out of range: the table is garbage
            return None, None
        hertz = mhz * 1e6
        if match["current"]:
            current = hertz
        if match["level"] != "S" and (highest is None or hertz > highest):
            highest = hertz
    return current, highest


def uevent(text: str | None) -> dict[str, str]:
    """KEY=value lines of a uevent file."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def properties(text: str | None) -> dict[str, int]:
    """'name value' lines of a KFD topology node's properties file (integers)."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        value = integer(parts[1]) if len(parts) == 2 else None
        if value is not None:
            out[parts[0]] = value
    return out
