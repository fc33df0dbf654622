"""How much memory this process may still take: what a run weighs its stacked arrays against before
deciding to map the cache instead (``--memory-map``)."""

from __future__ import annotations

from pathlib import Path

_CGROUP = Path("/sys/fs/cgroup")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _meminfo_available(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available(root: Path) -> int | None:
    """The container's limit less what it uses, its reclaimable file cache not counted (cgroup v2,
    else v1); None without a limit."""
    for limit_file, usage_file, stat_file, inactive in (
            ("memory.max", "memory.current", "memory.stat", "inactive_file"),
            ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "memory/memory.stat",
             "total_inactive_file")):
        limit, usage = _read_int(root / limit_file), _read_int(root / usage_file)
        if limit is None or usage is None or limit >= 2**60:  # v1 writes a huge number for no limit
            continue
        cache = 0
        try:
            for line in (root / stat_file).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == inactive:
                    cache = int(value)
        except (OSError, ValueError):
            pass
        return max(0, limit - max(0, usage - cache))
    return None


def available_memory(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = _CGROUP) -> tuple[int | None, str]:
    """``(bytes, where from)``: the smaller of the kernel's estimate of memory available without
    swapping (``MemAvailable``) and, in a container with a memory limit, that limit less the
    container's use; ``(None, reason)`` where neither can be read (not Linux)."""
    figures = {"MemAvailable": _meminfo_available(meminfo), "the cgroup's limit less its use": _cgroup_available(cgroup)}
    known = {source: value for source, value in figures.items() if value is not None}
    if not known:
        return None, "neither /proc/meminfo nor a cgroup memory limit could be read"
    source = min(known, key=known.get)
    return known[source], source
