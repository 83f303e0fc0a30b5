"""Simulated GPUs and their dcgm-exporter exposition.

Each GPU follows the load its engine rank puts on it: utilization is the share of recent time
spent in steps, power rises from idle towards the board limit with utilization (compute-bound
prefill more than memory-bound decode), temperature lags behind power, SM clocks drop from their
maximum when the board sits at its power limit and to the idle clock when nothing runs, each
with its clock event reason (power_cap, gpu_idle; none at full clocks, as the H200 recording
in the fixtures shows), and framebuffer use is the engine's allocation plus the activations of
the latest step. Faults set the last XID, add ECC errors and remap rows.

The exposition copies dcgm-exporter 4.x: the default counters in their order with their HELP
texts, labels ``gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION``
(XID also ``err_code, err_msg``), integers printed as integers and doubles with six decimals,
plus the fields an inference fleet should enable: ECC, row remapping, the clock event reasons
bitmask, the enforced power limit, the slowdown and shutdown temperatures, and NVLink errors
(on a board with NVLink only: DCGM leaves the fields blank on a PCIe board, and
dcgm-exporter omits a blank field).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

from inferwatch.capacity.planner import MIB, GPUSpec

DRIVER_VERSION = "580.95.05"
UTIL_TAU_S = 1.0  # utilization averaging window (NVML samples over about a second)
THERMAL_TAU_S = 3.0  # the H200 recording goes from 34 to 56 C in about 4 s of full load
#: share of the power limit at which the board counts as capped: the H200 recording shows the
#: power_cap reason from about 690 of 700 W (the simulated draw is a 1 s average, a little
#: below the peaks that trip the cap), and full clocks with no reason below it
POWER_CAP_SHARE = 0.95
#: NVML's clock event reason bits (nvmlClocksEventReason*), as in DCGM's bitmask field
GPU_IDLE, POWER_CAP = 0x1, 0x4
# From dcgm-exporter's xid_errors.go table (the codes faults are likely to use).
XID_MESSAGES = {
    0: "No Error",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- "
    "Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    140: "Unrecovered ECC Error",
}
# XIDs after which the CUDA context survives; every other one kills the engine on that GPU.
NON_FATAL_XIDS = frozenset({63, 92, 94, 154})

# (field, type, HELP) in dcgm-exporter's default-counters.csv order, then the opt-in fields.
_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending"),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge",
     "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*)."),
    ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge",
     "Effective power limit that the driver enforces after taking into account all limiters "
     "(in W)."),
    ("DCGM_FI_DEV_SLOWDOWN_TEMP", "gauge", "Slowdown temperature for the device (in C)."),
    ("DCGM_FI_DEV_SHUTDOWN_TEMP", "gauge", "Shutdown temperature for the device (in C)."),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
     "Total number of NVLink flow-control CRC errors."),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter",
     "Total number of NVLink data CRC errors."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter",
     "Total number of NVLink recovery errors."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
     "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
     "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
     "payloads - in bytes per second."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
     "The rate of data received over the PCIe bus - including both protocol headers and data "
     "payloads - in bytes per second."),
)  # fmt: skip


NVLINK_ERRORS = tuple(name for name, _, _ in _FIELDS if name.startswith("DCGM_FI_DEV_NVLINK_"))


@dataclass
class SimulatedGPU:
    index: int
    spec: GPUSpec
    uuid: str
    hostname: str
    allocated_bytes: int  # weights + KV cache + non-torch memory, held from start-up
    activation_bytes: int  # the engine's activation reserve, used in proportion to load
    busy_ewma: float = 0.0
    compute_ewma: float = 0.0
    temperature_c: float = 0.0
    energy_j: float = 0.0
    activation_share: float = 0.0
    last_update: float = 0.0
    last_step_end: float = 0.0
    xid: int = 0
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False

    def __post_init__(self) -> None:
        self.temperature_c = self.spec.idle_temp_c

    @property
    def pci_bus_id(self) -> str:
        return f"00000000:{0x18 + 0x10 * self.index:02X}:00.0"

    @property
    def power_w(self) -> float:
        swing = self.spec.tdp_watts - self.spec.idle_watts
        intensity = self.busy_ewma * (0.6 + 0.4 * self.compute_ewma)
        return self.spec.idle_watts + swing * intensity

    @property
    def idle(self) -> bool:
        return self.busy_ewma < 0.02

    @property
    def power_capped(self) -> bool:
        return not self.idle and self.power_w >= POWER_CAP_SHARE * self.spec.tdp_watts

    @property
    def sm_clock_mhz(self) -> int:
        if self.idle:
            return self.spec.idle_sm_clock_mhz
        if not self.power_capped:
            return self.spec.max_sm_clock_mhz
        throttle = 0.25 * self.compute_ewma * self.busy_ewma  # heavy compute at the limit
        return int(self.spec.max_sm_clock_mhz * (1 - throttle))

    @property
    def clock_event_reasons(self) -> int:
        """What holds the clocks below their maximum: nothing runs, or the power limit."""
        return (GPU_IDLE if self.idle else 0) | (POWER_CAP if self.power_capped else 0)

    @property
    def fb_used_bytes(self) -> int:
        return self.allocated_bytes + int(self.activation_bytes * self.activation_share)

    def _advance(self, until: float, busy: bool, compute_share: float) -> None:
        dt = until - self.last_update
        if dt <= 0:
            return
        keep = math.exp(-dt / UTIL_TAU_S)
        self.busy_ewma = self.busy_ewma * keep + (1 - keep) * (1.0 if busy else 0.0)
        if busy:
            self.compute_ewma = self.compute_ewma * keep + (1 - keep) * compute_share
        self.energy_j += self.power_w * dt
        swing = self.spec.tdp_watts - self.spec.idle_watts
        target = self.spec.idle_temp_c + 24.0 * (self.power_w - self.spec.idle_watts) / swing
        follow = math.exp(-dt / THERMAL_TAU_S)
        self.temperature_c = self.temperature_c * follow + (1 - follow) * target
        self.last_update = until

    def record_step(self, start: float, end: float, compute_share: float, load: float) -> None:
        """A step ran from ``start`` to ``end`` (simulated seconds); ``load``: share of budget."""
        self._advance(start, busy=False, compute_share=0.0)
        self._advance(end, busy=True, compute_share=compute_share)
        self.activation_share = min(1.0, load)
        self.last_step_end = end

    def settle(self, now: float) -> None:
        """Bring the readings up to ``now`` (idle since the last step)."""
        self._advance(now, busy=False, compute_share=0.0)
        if now - self.last_step_end > UTIL_TAU_S:
            self.activation_share = 0.0

    def clear_faults(self) -> None:
        """Back to the healthy GPU the simulator started with: no XID, no ECC errors, no
        remapped rows, nothing pending or failed."""
        self.xid = 0
        self.ecc_sbe = self.ecc_dbe = 0
        self.remapped_correctable = self.remapped_uncorrectable = 0
        self.remap_pending = self.remap_failure = False

    def values(self) -> dict[str, int | float]:
        """Each field's reading; a field DCGM leaves blank on this board is absent."""
        fb_total = self.spec.total_bytes // MIB
        fb_reserved = self.spec.reserved_bytes // MIB
        fb_used = min(self.fb_used_bytes // MIB, fb_total - fb_reserved)
        util = round(100 * self.busy_ewma)
        return {
            "DCGM_FI_DEV_SM_CLOCK": self.sm_clock_mhz,
            "DCGM_FI_DEV_MEM_CLOCK": self.spec.mem_clock_mhz,
            "DCGM_FI_DEV_MEMORY_TEMP": round(self.temperature_c + 1),
            "DCGM_FI_DEV_GPU_TEMP": round(self.temperature_c),
            "DCGM_FI_DEV_POWER_USAGE": round(self.power_w, 3),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(self.energy_j * 1000),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
            "DCGM_FI_DEV_GPU_UTIL": util,
            "DCGM_FI_DEV_MEM_COPY_UTIL": round(util * (1 - self.compute_ewma)),
            "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": 0,
            "DCGM_FI_DEV_XID_ERRORS": self.xid,
            "DCGM_FI_DEV_FB_FREE": fb_total - fb_reserved - fb_used,
            "DCGM_FI_DEV_FB_USED": fb_used,
            "DCGM_FI_DEV_FB_RESERVED": fb_reserved,
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": self.remapped_uncorrectable,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": self.remapped_correctable,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": int(self.remap_failure),
            "DCGM_FI_DEV_ROW_REMAP_PENDING": int(self.remap_pending),
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": self.ecc_sbe,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": self.ecc_dbe,
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": self.clock_event_reasons,
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": float(self.spec.tdp_watts),
            "DCGM_FI_DEV_SLOWDOWN_TEMP": self.spec.slowdown_temp_c,
            "DCGM_FI_DEV_SHUTDOWN_TEMP": self.spec.shutdown_temp_c,
            **dict.fromkeys(NVLINK_ERRORS if self.spec.nvlinks else (), 0),
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(self.busy_ewma, 6),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(self.busy_ewma * self.compute_ewma * 0.8, 6),
            "DCGM_FI_PROF_DRAM_ACTIVE": round(self.busy_ewma * (1 - 0.5 * self.compute_ewma), 6),
            "DCGM_FI_PROF_PCIE_TX_BYTES": int(100_000 + 20_000_000 * self.busy_ewma),
            "DCGM_FI_PROF_PCIE_RX_BYTES": int(20_000 + 5_000_000 * self.busy_ewma),
        }


def gpu_uuid(seed: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"inferwatch-sim/{seed}/{index}"))


def _format(value: int | float) -> str:
    return str(value) if isinstance(value, int) else f"{value:f}"


def render_dcgm(gpus: list[SimulatedGPU], now: float) -> str:
    """The text dcgm-exporter serves for these GPUs."""
    for gpu in gpus:
        gpu.settle(now)
    readings = [(gpu, gpu.values()) for gpu in gpus]
    lines: list[str] = []
    for field, kind, doc in _FIELDS:
        present = [(gpu, values) for gpu, values in readings if field in values]
        if not present:
            continue
        lines += [f"# HELP {field} {doc}", f"# TYPE {field} {kind}"]
        for gpu, values in present:
            labels = (
                f'gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",'
                f'device="nvidia{gpu.index}",modelName="{gpu.spec.model_name}",'
                f'Hostname="{gpu.hostname}",DCGM_FI_DRIVER_VERSION="{DRIVER_VERSION}"'
            )
            if field == "DCGM_FI_DEV_XID_ERRORS":
                message = XID_MESSAGES.get(gpu.xid, "Unknown Error")
                labels += f',err_code="{gpu.xid}",err_msg="{message}"'
            lines.append(f"{field}{{{labels}}} {_format(values[field])}")
    return "\n".join(lines) + "\n"
