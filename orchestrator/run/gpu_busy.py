"""How busy the package's GPUs were, read by the host watch outside the ranks: NVML's utilisation samples (the share
of each driver sample period in which a kernel ran) gathered per watch interval, for the audit's launch-bound check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from protocol.host.gpu_library import lib_call, lib_const
from protocol.host.quiet_host import WatchUtil


class UtilSampler:
    """`read()` at each watch sample: per GPU, the mean of the utilisation samples NVML took since the previous read.

    NVML keeps a ring of timestamped samples (its DeviceGetSamples call); each read asks for those after the newest one
    seen, so no sample counts twice and none before the watch started counts at all (the first read only sets the
    base). Where the driver keeps no samples, the current rate (its DeviceGetUtilizationRates call, an average over its
    own last period) stands for the interval: `query` is then "rate".
    """

    def __init__(self, lib: Any, handles: Sequence[tuple[int, Any]]) -> None:
        self._lib = lib
        self._handles = list(handles)
        self._seen: dict[int, int] = {}  # GPU index -> newest sample timestamp read (us)
        self._rate_only: set[int] = set()
        self.query = "ok" if self._handles else "no GPU watched"

    def read(self) -> list[WatchUtil]:
        out: list[WatchUtil] = []
        for index, handle in self._handles:
            try:
                util = self._read_one(index, handle)
            except Exception as exc:  # one GPU's error: say why, keep the others
                self.query = f"NVML error ({type(exc).__name__})"
                continue
            if util is not None:
                out.append(util)
        return out

    def _read_one(self, index: int, handle: Any) -> WatchUtil | None:
        if index not in self._rate_only:
            try:
                _, samples = lib_call(self._lib, "DeviceGetSamples", handle,
                                      lib_const(self._lib, "GPU_UTILIZATION_SAMPLES"), self._seen.get(index, 0))
            except Exception:  # not supported on this GPU or driver: the current rate instead
                self._rate_only.add(index)
                self.query = "rate"
            else:
                return self._from_samples(index, [(int(s.timeStamp), _value(s)) for s in samples])
        rate = lib_call(self._lib, "DeviceGetUtilizationRates", handle)
        return WatchUtil(index=index, busy=round(min(max(float(rate.gpu), 0.0), 100.0) / 100.0, 4), samples=1)

    def _from_samples(self, index: int, samples: list[tuple[int, float]]) -> WatchUtil | None:
        first = index not in self._seen
        last = self._seen.get(index, 0)
        fresh = [(t, v) for t, v in samples if t > last]
        if fresh:
            self._seen[index] = max(t for t, _ in fresh)
        elif first:
            self._seen[index] = 0
        if first or not fresh:  # the base (samples from before the watch), or none arrived in this interval
            return None
        busy = sum(min(max(v, 0.0), 100.0) for _, v in fresh) / len(fresh) / 100.0
        return WatchUtil(index=index, busy=round(busy, 4), samples=len(fresh))


def _value(sample: Any) -> float:
    """A utilisation sample's value (percent): an unsigned int in NVML's value union for this sample type."""
    value = sample.sampleValue
    return float(getattr(value, "uiVal", value))
