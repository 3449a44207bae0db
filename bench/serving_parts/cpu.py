"""Where a run's CPU went, per answered request: the serving processes, the load generator (this
process) and everything else on the machine (for ours: Serve's controller and proxies, the raylet, GCS
and the dashboard agent; the kernel's network work on both sides).

Read from ``/proc`` before and after a run: the machine's busy time, and each process's own CPU time.
The serving processes are Serve's replicas (``ray::ServeReplica:...``) and uvicorn's worker processes
(children of a ``uvicorn`` process)."""

import os

import psutil

CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU-seconds every core spent on anything but idle and I/O wait since boot."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / CLK_TCK


def _is_server(process: psutil.Process) -> bool:
    cmdline = process.cmdline()
    if cmdline and cmdline[0].startswith("ray::ServeReplica"):
        return True
    parent = process.parent()
    return parent is not None and any("uvicorn" in part for part in parent.cmdline())


def server_cpu_s() -> dict[int, float]:
    """Each serving process's CPU-seconds so far, by pid."""
    seconds = {}
    for process in psutil.process_iter():
        try:
            if _is_server(process):
                times = process.cpu_times()
                seconds[process.pid] = times.user + times.system
        except psutil.Error:  # gone, or not ours to read
            continue
    return seconds


class CpuSplit:
    """``with CpuSplit() as split: <run>``, then ``split.per_request_ms(n)``: the run's CPU-milliseconds
    per request for the servers, the load generator and the rest of the machine."""

    def __enter__(self) -> "CpuSplit":
        self._start = (server_cpu_s(), self._client_s(), machine_busy_s())
        return self

    def __exit__(self, *exc) -> None:
        servers, client, busy = self._start
        # A server that started during the run counts from zero; one that ended is left out.
        self.servers = sum(seconds - servers.get(pid, 0.0) for pid, seconds in server_cpu_s().items())
        self.client, self.busy = self._client_s() - client, machine_busy_s() - busy

    @staticmethod
    def _client_s() -> float:
        times = psutil.Process().cpu_times()
        return times.user + times.system

    def per_request_ms(self, requests: int) -> dict[str, float]:
        rest = max(self.busy - self.servers - self.client, 0.0)
        return {
            f"cpu_{role}_ms": 1e3 * seconds / max(requests, 1)
            for role, seconds in (("server", self.servers), ("client", self.client), ("rest", rest))
        }
