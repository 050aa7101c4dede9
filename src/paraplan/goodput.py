"""Failures, restarts and checkpoint interval: what share of wall time trains (goodput).

Failure rate. The default is the Llama 3 405B pre-training record (Dubey et al. 2024, The Llama 3 Herd of Models,
section 3.3.4): 466 job interruptions in a 54-day snapshot on 16,384 H100, 47 of them planned (automated
maintenance such as firmware upgrades, operator-initiated configuration or dataset updates) and 419 unexpected.
The planned ones are scheduled and can follow a checkpoint, so they do not lose work the way a failure does; the
default counts the 419 unexpected ones:

    419 / (16,384 GPUs x 54 days x 24 h) = 419 / 21,233,664 GPU-hours = 1.973e-5 failures per GPU-hour,

i.e. 7.76 failures a day and a job MTBF of 3.09 h on 16,384 GPUs (Meta: "about 90% effective training time").
The rate is per GPU-hour so it scales with the job: MTBF = 1 / (rate x GPUs). Override it with
``failure_rate_per_gpu_hour`` in the site file.

Per failure the job loses the restart (``restart_s`` = job requeue ``requeue_s`` + checkpoint load) and, on
average, half a checkpoint period of work. With ``--async-save`` a checkpoint only counts once its background write
has finished (Megatron-LM megatron/training/checkpointing.py: ``save_checkpoint`` hands the write to
``schedule_async_save``, and ``maybe_finalize_async_save`` finalizes it, writing the tracker file
latest_checkpointed_iteration.txt, only after the write completed). A failure inside the write window
w = save_s - delta (the part of the save that overlaps training) restarts from the checkpoint before, one period
further back, so on average a failure loses T / 2 + w of work (w = 0 for a synchronous save). With tau the
training time between two saves, delta the training time one save blocks, M the MTBF and R the restart time, a
period lasts T = tau + delta of wall time and

    goodput = useful / wall = tau / T x (1 - (R + w + T / 2) / M)        (clamped to [0, 1])

It is largest near Daly's higher-order optimum (Daly 2006, "A higher order estimate of the optimum checkpoint
interval for restart dumps", FGCS 22(3), eq. 37; Young 1974, CACM 17(9), is its first-order term sqrt(2 delta M)):

    tau_opt = sqrt(2 delta M) x [1 + (1/3) sqrt(delta / (2 M)) + delta / (18 M)] - delta    for delta < 2 M,
    tau_opt = M                                                                               otherwise.

An asynchronous save cannot start before the previous one has finished writing, so the interval is at least the
full save time. All functions are pure; times in seconds, rates per GPU-hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from paraplan.errors import SpecError
from paraplan.units import SECONDS_PER_DAY, SECONDS_PER_HOUR

LLAMA3_UNEXPECTED_INTERRUPTIONS: Final = 419
"""Unexpected interruptions of Llama 3 405B pre-training (of 466; Llama 3 paper section 3.3.4, Table 5)."""
LLAMA3_NUM_GPUS: Final = 16_384
LLAMA3_SNAPSHOT_DAYS: Final = 54
DEFAULT_FAILURE_RATE_PER_GPU_HOUR: Final = LLAMA3_UNEXPECTED_INTERRUPTIONS / (
    LLAMA3_NUM_GPUS * LLAMA3_SNAPSHOT_DAYS * 24)
"""1.973e-5 failures per GPU-hour (derivation in the module docstring)."""
DEFAULT_REQUEUE_S: Final = 600.0
"""Time from a failure until the job runs again, before loading the checkpoint: detection, requeue, node
allocation and start-up (an assumption, not measured here; ``requeue_s`` in the site file)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureSpec:
    """Failure rate and requeue time of a site (site file keys ``failure_rate_per_gpu_hour``, ``requeue_s``)."""

    failure_rate_per_gpu_hour: float = DEFAULT_FAILURE_RATE_PER_GPU_HOUR
    requeue_s: float = DEFAULT_REQUEUE_S

    def __post_init__(self) -> None:
        if not (math.isfinite(self.failure_rate_per_gpu_hour) and self.failure_rate_per_gpu_hour >= 0):
            raise SpecError(f"failure_rate_per_gpu_hour must be >= 0, got {self.failure_rate_per_gpu_hour}")
        if not (math.isfinite(self.requeue_s) and self.requeue_s >= 0):
            raise SpecError(f"requeue_s must be >= 0, got {self.requeue_s}")


def failures_per_day(failure_rate_per_gpu_hour: float, num_gpus: int) -> float:
    """Expected failures a day of a ``num_gpus`` job: rate x GPUs x 24."""
    return failure_rate_per_gpu_hour * num_gpus * 24.0


def mtbf_s(failure_rate_per_gpu_hour: float, num_gpus: int) -> float:
    """Mean time between failures of the job in seconds: 3600 / (rate x GPUs); inf at rate 0."""
    rate_per_s = failure_rate_per_gpu_hour * num_gpus / SECONDS_PER_HOUR
    return math.inf if rate_per_s == 0 else 1.0 / rate_per_s


def daly_interval_s(save_blocking_s: float, mtbf_seconds: float) -> float:
    """Daly's (2006) checkpoint interval (training time between saves) that maximises goodput:
    sqrt(2 delta M) x [1 + sqrt(delta / (2 M)) / 3 + delta / (18 M)] - delta for delta < 2 M, else M."""
    if not (save_blocking_s >= 0 and mtbf_seconds > 0) or math.isnan(save_blocking_s):
        raise SpecError(f"daly_interval_s: save time must be >= 0 and MTBF > 0, got {save_blocking_s}, "
                        f"{mtbf_seconds}")
    delta, m = save_blocking_s, mtbf_seconds
    if math.isinf(m):
        return math.inf
    if delta >= 2.0 * m:
        return m
    return math.sqrt(2.0 * delta * m) * (1.0 + math.sqrt(delta / (2.0 * m)) / 3.0 + delta / (18.0 * m)) - delta


def goodput_fraction(interval_s: float, save_blocking_s: float, restart_s: float, mtbf_seconds: float,
                     write_window_s: float = 0.0) -> float:
    """Useful / wall time: tau / (tau + delta) x (1 - (R + w + (tau + delta) / 2) / M), clamped to [0, 1];
    ``write_window_s`` w is the part of an async save that runs behind training (0 for a synchronous save)."""
    if interval_s <= 0 or save_blocking_s < 0 or restart_s < 0 or mtbf_seconds <= 0 or not write_window_s >= 0:
        raise SpecError("goodput_fraction: interval must be > 0, save, restart and write times >= 0, MTBF > 0")
    period_s = interval_s + save_blocking_s
    lost_per_failure_s = restart_s + write_window_s + period_s / 2.0
    survive = 1.0 if math.isinf(mtbf_seconds) else 1.0 - lost_per_failure_s / mtbf_seconds
    return min(1.0, max(0.0, interval_s / period_s * survive))


@dataclass(frozen=True, slots=True)
class GoodputPlan:
    """Checkpoint interval and goodput of one run."""

    goodput: float
    save_interval_iters: int
    interval_s: float
    """Training time between saves (save_interval_iters x step time)."""
    mtbf_s: float
    failures_per_day: float
    restart_s: float
    """Requeue + checkpoint load."""
    lost_per_failure_s: float
    """Restart + the async write window + half a checkpoint period."""
    save_blocking_s: float
    write_window_s: float = 0.0
    """The part of an async save that runs behind training (save time - blocking time; 0 when synchronous)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (an infinite MTBF as None)."""
        return {"goodput": self.goodput, "save_interval_iters": self.save_interval_iters,
                "interval_s": self.interval_s, "mtbf_s": None if math.isinf(self.mtbf_s) else self.mtbf_s,
                "failures_per_day": self.failures_per_day, "restart_s": self.restart_s,
                "lost_per_failure_s": self.lost_per_failure_s, "save_blocking_s": self.save_blocking_s,
                "write_window_s": self.write_window_s}


def plan_checkpoints(*, step_s: float, num_gpus: int, save_blocking_s: float, save_s: float, load_s: float,
                     failures: FailureSpec, train_iters: int | None = None) -> GoodputPlan:
    """Daly's interval in whole iterations (at least one; at least one full save time, since an async
    save must finish before the next; at most the run) and the goodput it gives."""
    if step_s <= 0:
        raise SpecError(f"step time must be > 0, got {step_s}")
    m = mtbf_s(failures.failure_rate_per_gpu_hour, num_gpus)
    restart = failures.requeue_s + load_s
    window = max(0.0, save_s - save_blocking_s)
    tau = daly_interval_s(save_blocking_s, m)
    tau = max(tau, save_s)
    iters = max(1, math.ceil(save_s / step_s), round(tau / step_s) if math.isfinite(tau) else 1)
    if train_iters is not None:
        iters = max(1, min(iters, train_iters)) if math.isfinite(tau) else max(1, train_iters)
    elif not math.isfinite(tau):
        iters = max(iters, round(SECONDS_PER_DAY / step_s))  # no failures: one save a day
    interval = iters * step_s
    return GoodputPlan(goodput=goodput_fraction(interval, save_blocking_s, restart, m, window),
                       save_interval_iters=iters,
                       interval_s=interval, mtbf_s=m,
                       failures_per_day=failures_per_day(failures.failure_rate_per_gpu_hour, num_gpus),
                       restart_s=restart, lost_per_failure_s=restart + window + (interval + save_blocking_s) / 2.0,
                       save_blocking_s=save_blocking_s, write_window_s=window)
