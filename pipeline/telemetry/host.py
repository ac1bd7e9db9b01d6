"""Host samples: CPU, load, memory, the job's process tree, the output disk and IO rates.

``psutil`` is imported lazily. Without it the sample keeps what the standard library can give cheaply (load
average, memory from ``/proc/meminfo``, disk space) and says in ``host["psutil"]`` what is missing.

The host part of a telemetry message::

    {"cpu_percent", "cpu_count", "load1", "load5", "load15",
     "ram_used", "ram_total", "ram_available", "swap_used", "swap_total",
     "procs": [{"pid", "ppid", "name", "rss", "cpu_percent", "state", "zombie"}], "zombies": int,
     "disk": {"path", "fs_path", "free", "total", "output_bytes", "output_files", "growth_bytes_per_s",
              "fs_growth_bytes_per_s", "full_in_s"} | None,
     "net": {"rx_bytes_per_s", "tx_bytes_per_s"} | None, "disk_io": {"read_bytes_per_s", "write_bytes_per_s"} | None,
     "psutil": None | "why some fields are n/a"}

``ram_used`` is ``ram_total - ram_available``: what the kernel could not hand to a new allocation.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import deque
from typing import Any, Iterable

_PSUTIL_MISSING = "psutil is not installed: the job's processes and IO rates are n/a"


def _import_psutil() -> Any:
    try:
        import psutil  # noqa: PLC0415 - optional
    except ImportError:
        return None
    return psutil


def rate(previous: float | None, current: float | None, seconds: float) -> float | None:
    """Per-second rate between two counter readings; None without a previous reading or a positive interval.
    A counter that went backwards (wrapped, reset) gives None rather than a negative rate."""
    if previous is None or current is None or seconds <= 0 or current < previous:
        return None
    return (current - previous) / seconds


# -- pids --------------------------------------------------------------------------------------------
def pid_state(pid: int) -> str | None:
    """``"running"`` (any live state), ``"zombie"`` (exited, not reaped) or None (no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return None
    except OSError:
        stat = b""
    if stat:
        # The state follows the command name, which is in parentheses and may itself contain ")".
        state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
        return "zombie" if state in (b"Z", b"X") else "running"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return "running"
    return "running"


def visible_pids(pids: Iterable[int]) -> set[int]:
    """Those of ``pids`` that exist in this PID namespace."""
    if os.path.isdir("/proc/self"):
        return {pid for pid in pids if os.path.exists(f"/proc/{pid}")}
    psutil = _import_psutil()
    if psutil is None:
        return set(pids)
    return {pid for pid in pids if psutil.pid_exists(pid)}


def ppid_map(psutil: Any = None) -> dict[int, int]:
    """pid → parent pid of every process on the host, from one pass over ``/proc`` (or psutil elsewhere)."""
    out: dict[int, int] = {}
    if os.path.isdir("/proc/self"):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    stat = fh.read()
                out[int(name)] = int(stat[stat.rfind(b")") + 2 :].split(None, 2)[1])
            except (OSError, ValueError, IndexError):
                continue
        return out
    if psutil is not None:
        for proc in psutil.process_iter(["ppid"]):
            out[proc.pid] = proc.info["ppid"]
    return out


def descendants(roots: Iterable[int], parents: dict[int, int]) -> list[int]:
    """The roots that exist, then all their descendants, each once (breadth first)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    order: list[int] = []
    seen: set[int] = set()
    queue = deque(pid for pid in roots if pid in parents)
    while queue:
        pid = queue.popleft()
        if pid in seen:
            continue
        seen.add(pid)
        order.append(pid)
        queue.extend(sorted(children.get(pid, ())))
    return order


# -- output disk -------------------------------------------------------------------------------------
def _existing_ancestor(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def folder_size(path: str) -> tuple[int, int]:
    """(bytes, files) of the regular files under ``path``; files that vanish meanwhile are skipped."""
    total = files = 0
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            entries = os.scandir(folder)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                        files += 1
                except OSError:
                    continue
    return total, files


class OutputDiskWatch:
    """Free space of the filesystem holding the output folder, and how fast the output grows.

    Free space is one ``statvfs`` a sample. The output's own size needs a walk of the folder, which for a long
    extraction holds many thousands of files, so the walk is spaced out: at least ``scan_min_interval_s`` apart,
    and at least ``1 / scan_budget`` times as long apart as the last walk took (with the default 0.005 a folder
    that takes 20 ms to walk is walked every 4 s at most). The folder's growth rate is measured between walks; the
    filesystem's (any writer) between samples.
    """

    def __init__(self, path: str, *, scan_min_interval_s: float = 5.0, scan_budget: float = 0.005) -> None:
        self.path = os.path.abspath(path)
        self.scan_min_interval_s = scan_min_interval_s
        self.scan_budget = scan_budget
        self._next_scan = 0.0
        self._last_scan: tuple[float, int] | None = None
        self._output_bytes: int | None = None
        self._output_files: int | None = None
        self._growth: float | None = None
        self._last_used: tuple[float, int] | None = None

    def sample(self, now: float | None = None) -> dict[str, Any]:
        now = time.monotonic() if now is None else now
        fs_path = _existing_ancestor(self.path)
        free: int | None
        total: int | None
        used: int | None
        try:
            usage = shutil.disk_usage(fs_path)
            free, total, used = usage.free, usage.total, usage.used
        except OSError:
            free = total = used = None
        fs_growth = None
        if used is not None:
            if self._last_used is not None:
                fs_growth = rate(self._last_used[1], used, now - self._last_used[0])
            self._last_used = (now, used)
        if now >= self._next_scan:
            self._scan(now)
        growth = self._growth
        basis = growth if growth is not None else fs_growth
        full_in_s = round(free / basis, 1) if free is not None and basis and basis > 0 else None
        return {
            "path": self.path,
            "fs_path": fs_path,
            "free": free,
            "total": total,
            "output_bytes": self._output_bytes,
            "output_files": self._output_files,
            "growth_bytes_per_s": None if growth is None else round(growth, 1),
            "fs_growth_bytes_per_s": None if fs_growth is None else round(fs_growth, 1),
            "full_in_s": full_in_s,
        }

    def _scan(self, now: float) -> None:
        if not os.path.isdir(self.path):
            self._output_bytes = self._output_files = None
            self._next_scan = now + self.scan_min_interval_s
            return
        started = time.perf_counter()
        size, files = folder_size(self.path)
        took = time.perf_counter() - started
        if self._last_scan is not None:
            self._growth = rate(self._last_scan[1], size, now - self._last_scan[0])
            if self._growth is None and size < self._last_scan[1]:
                self._growth = 0.0  # files removed: shrinking output is not growth
        self._last_scan = (now, size)
        self._output_bytes, self._output_files = size, files
        self._next_scan = now + max(self.scan_min_interval_s, took / self.scan_budget if self.scan_budget else 0.0)


# -- host --------------------------------------------------------------------------------------------
def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    out[key] = int(parts[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


class HostSampler:
    """Samples the host and the job's process tree. Keeps the previous counters to turn them into rates."""

    def __init__(
        self,
        output_dir: str | None = None,
        *,
        max_procs: int = 256,
        scan_min_interval_s: float = 5.0,
        tree_rescan_s: float = 5.0,
        tree_budget: float = 0.002,
        psutil_module: Any = None,
    ) -> None:
        self.psutil = psutil_module if psutil_module is not None else _import_psutil()
        self.scan_min_interval_s = scan_min_interval_s
        self.disk: OutputDiskWatch | None = None
        self.set_output_dir(output_dir)
        self.max_procs = max_procs
        self._procs: dict[int, Any] = {}
        self._cpu_primed: set[int] = set()
        self.tree_rescan_s = tree_rescan_s
        self.tree_budget = tree_budget
        self._tree_roots: tuple[int, ...] | None = None
        self._tree_dirty = False
        self._tree_next = 0.0
        self._tree_earliest = 0.0
        self._io: tuple[float, Any, Any] | None = None
        self._cpu_primed_at: float | None = None
        self._proc_stat: tuple[int, int] | None = None if self.psutil is not None else _proc_stat_cpu()
        if self.psutil is not None:
            self.psutil.cpu_percent(interval=None)  # the first call only primes the counter
            self._cpu_primed_at = time.monotonic()

    def set_output_dir(self, output_dir: str | None) -> None:
        """Watch this folder's disk (None: no disk); its growth is measured afresh."""
        if self.disk is not None and output_dir and os.path.abspath(output_dir) == self.disk.path:
            return
        self.disk = OutputDiskWatch(output_dir, scan_min_interval_s=self.scan_min_interval_s) if output_dir else None

    # -- the job's process tree ------------------------------------------------------------------------
    def job_tree(self, roots: Iterable[int]) -> list[Any]:
        """psutil.Process objects of the roots and all their descendants (cached, so CPU % works).

        Finding descendants means reading every process's parent on the host (one pass over ``/proc/*/stat`` for
        all roots), which on a busy host costs milliseconds. So the tree is rediscovered only when the roots
        change, when one of its processes has gone, or every ``tree_rescan_s`` seconds, but no sooner than
        ``1 / tree_budget`` times the last discovery took (unless the roots change); in between the known
        processes are sampled.
        """
        roots_key = tuple(sorted(set(roots)))
        now = time.monotonic()
        if roots_key == self._tree_roots and (
            now < self._tree_earliest or (not self._tree_dirty and now < self._tree_next)
        ):
            return list(self._procs.values())
        started = time.perf_counter()
        seen: dict[int, Any] = {}
        for pid in descendants(roots_key, ppid_map(self.psutil)):
            proc = self._process(pid)
            if proc is not None:
                seen[pid] = proc
        # Forget processes that left the tree, so their pids can be reused without a stale CPU baseline.
        self._procs = {pid: self._procs[pid] for pid in seen if pid in self._procs}
        self._cpu_primed &= self._procs.keys()
        took = time.perf_counter() - started
        self._tree_roots, self._tree_dirty = roots_key, False
        self._tree_earliest = now + (took / self.tree_budget if self.tree_budget else 0.0)
        self._tree_next = max(now + self.tree_rescan_s, self._tree_earliest)
        return list(seen.values())

    def _process(self, pid: int, fresh: Any = None) -> Any:
        psutil = self.psutil
        cached = self._procs.get(pid)
        if cached is not None:
            try:
                if cached.is_running():  # same pid and same create time
                    return cached
            except psutil.Error:
                pass
        try:
            proc = fresh if fresh is not None else psutil.Process(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        self._procs[pid] = proc
        self._cpu_primed.discard(pid)
        return proc

    def _proc_row(self, proc: Any) -> dict[str, Any] | None:
        psutil = self.psutil
        try:
            with proc.oneshot():
                state = proc.status()
                zombie = state == psutil.STATUS_ZOMBIE
                row = {
                    "pid": proc.pid,
                    "ppid": proc.ppid(),
                    "name": proc.name(),
                    "rss": None,
                    "cpu_percent": None,
                    "state": state,
                    "zombie": zombie,
                }
                if not zombie:
                    row["rss"] = proc.memory_info().rss
                    cpu = proc.cpu_percent(interval=None)
                    # psutil's first reading of a process has no baseline and always reads 0.0.
                    row["cpu_percent"] = round(cpu, 1) if proc.pid in self._cpu_primed else None
                    self._cpu_primed.add(proc.pid)
        except psutil.ZombieProcess:
            row = {"pid": proc.pid, "ppid": None, "name": None, "rss": None, "cpu_percent": None,
                   "state": "zombie", "zombie": True}
        except psutil.NoSuchProcess:
            self._tree_dirty = True
            return None
        except psutil.AccessDenied:
            return None
        return row

    # -- the whole sample ------------------------------------------------------------------------------
    def sample(self, job_pids: Iterable[int] = ()) -> tuple[dict[str, Any], set[int]]:
        """(host part of a telemetry message, the job's process tree as a set of pids)."""
        now = time.monotonic()
        host: dict[str, Any] = {
            "cpu_percent": None,
            "cpu_count": os.cpu_count(),
            "load1": None,
            "load5": None,
            "load15": None,
            "ram_used": None,
            "ram_total": None,
            "ram_available": None,
            "swap_used": None,
            "swap_total": None,
            "procs": None,
            "zombies": None,
            "disk": self.disk.sample(now) if self.disk else None,
            "net": None,
            "disk_io": None,
            "psutil": None,
        }
        try:
            host["load1"], host["load5"], host["load15"] = (round(x, 2) for x in os.getloadavg())
        except OSError:
            pass
        roots = list(job_pids)
        psutil = self.psutil
        if psutil is None:
            self._sample_without_psutil(host)
            # Still worth knowing which GPU processes are the job's; /proc gives the tree without psutil.
            return host, set(descendants(roots, ppid_map())) if roots else set()

        cpu = psutil.cpu_percent(interval=None)
        # Over less than a tenth of a second the system's CPU counters say little: n/a rather than noise.
        if self._cpu_primed_at is not None and now - self._cpu_primed_at >= 0.1:
            host["cpu_percent"] = max(0.0, round(cpu, 1))
        self._cpu_primed_at = now
        vm = psutil.virtual_memory()
        host["ram_total"], host["ram_available"] = vm.total, vm.available
        host["ram_used"] = vm.total - vm.available
        try:
            sw = psutil.swap_memory()
            host["swap_used"], host["swap_total"] = sw.used, sw.total
        except (OSError, RuntimeError):
            pass

        tree = self.job_tree(roots) if roots else []
        rows, gone = [], set()
        for proc in tree[: self.max_procs]:
            row = self._proc_row(proc)
            if row is None:
                gone.add(proc.pid)
            else:
                rows.append(row)
        host["procs"] = rows
        host["zombies"] = sum(1 for row in rows if row["zombie"])
        host["net"], host["disk_io"] = self._io_rates(now)
        return host, {proc.pid for proc in tree} - gone

    def _io_rates(self, now: float) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        psutil = self.psutil
        try:
            net = psutil.net_io_counters()
        except (OSError, RuntimeError):
            net = None
        try:
            disk = psutil.disk_io_counters()
        except (OSError, RuntimeError):
            disk = None
        previous, self._io = self._io, (now, net, disk)
        if previous is None:
            return None, None
        dt = now - previous[0]
        net_rates = disk_rates = None
        if net is not None and previous[1] is not None:
            net_rates = {
                "rx_bytes_per_s": _round(rate(previous[1].bytes_recv, net.bytes_recv, dt)),
                "tx_bytes_per_s": _round(rate(previous[1].bytes_sent, net.bytes_sent, dt)),
            }
        if disk is not None and previous[2] is not None:
            disk_rates = {
                "read_bytes_per_s": _round(rate(previous[2].read_bytes, disk.read_bytes, dt)),
                "write_bytes_per_s": _round(rate(previous[2].write_bytes, disk.write_bytes, dt)),
            }
        return net_rates, disk_rates

    def _sample_without_psutil(self, host: dict[str, Any]) -> None:
        host["psutil"] = _PSUTIL_MISSING
        # The host's CPU use from /proc/stat's counters since the last sample (none at the first).
        counters = _proc_stat_cpu()
        if counters is not None and self._proc_stat is not None:
            busy, total = counters[0] - self._proc_stat[0], counters[1] - self._proc_stat[1]
            if total > 0:
                host["cpu_percent"] = round(max(0.0, min(100.0, 100.0 * busy / total)), 1)
        self._proc_stat = counters
        info = _meminfo()
        if "MemTotal" in info:
            host["ram_total"] = info["MemTotal"]
            available = info.get("MemAvailable")
            host["ram_available"] = available
            host["ram_used"] = None if available is None else info["MemTotal"] - available
        if "SwapTotal" in info:
            host["swap_total"] = info["SwapTotal"]
            host["swap_used"] = info["SwapTotal"] - info.get("SwapFree", 0)


def _proc_stat_cpu(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs, from the first line of /proc/stat; None where there is none."""
    try:
        with open(path, "rb") as f:
            line = f.readline(4096)
        parts = line.split()
        if not parts or parts[0] != b"cpu":
            return None
        # user nice system idle iowait irq softirq steal (guest time is counted in user already)
        values = [int(v) for v in parts[1:9]]
    except (OSError, ValueError):
        return None
    idle = sum(values[3:5])
    return sum(values) - idle, sum(values)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
