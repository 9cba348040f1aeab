"""Room for an output: free disk of its folder and the memory this process can still get, checked
before a command starts writing so that it stops with one line instead of half-way."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from jepa_cli.data import buckets
from jepa_cli.data.urls import BucketPath, location
from jepa_cli.errors import InputError


def check_room(output: str | os.PathLike, disk: int, memory: int, disk_hint: str, memory_hint: str) -> None:
    """InputError if writing `output` needs more than the free disk of its folder (`disk` bytes) or
    the memory this process can still get (`memory` bytes); the message gives both figures and a hint."""
    output = location(output)
    check_memory(output, memory, memory_hint)
    folder = buckets.staging_root() if isinstance(output, BucketPath) else output.parent  # where it is written
    free_disk = shutil.disk_usage(folder).free
    if disk > free_disk:
        raise InputError(f"{output}: needs about {format_bytes(disk)} of disk but {format_bytes(free_disk)} is "
                         f"free in {folder}; {disk_hint}")

def check_memory(where: str | os.PathLike, memory: int, hint: str) -> None:
    """InputError naming `where` if `memory` bytes exceed what this process can still get; the message
    gives both figures and the hint."""
    free_memory = available_memory()
    if free_memory is not None and memory > free_memory:
        raise InputError(f"{where}: needs about {format_bytes(memory)} of memory but {format_bytes(free_memory)} "
                         f"is available; {hint}")

def available_memory() -> int | None:
    """Bytes this process can still allocate without swapping, or None where unknown.

    Linux: MemAvailable (free memory plus reclaimable caches), capped by the cgroup's limit less
    its usage (containers); elsewhere free pages from os.sysconf.
    """
    found = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as meminfo:
            found = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    if found is None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        with contextlib.suppress(OSError, ValueError):
            room = int(Path(limit_file).read_text()) - int(Path(usage_file).read_text())  # "max" -> ValueError
            found = room if found is None else min(found, room)
            break
    return found

def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    power = 0
    while abs(n) >= 1024 and power < len(units) - 1:
        n, power = n / 1024, power + 1
    return f"{n:.0f} B" if power == 0 else f"{n:.1f} {units[power]}"
