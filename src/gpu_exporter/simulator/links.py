"""Runtime state of a simulated GPU's interconnect: NVLink links, the PCIe link, the fabric.

Traffic follows the workloads: NVLink carries collective traffic in proportion to tensor-pipe
activity (all-reduce between compute phases), PCIe carries host traffic in proportion to memory
activity plus a trickle at idle. The PCIe link trains down a generation at idle (power saving),
as real GPUs do; a scenario event can also train it to fewer lanes or a lower generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_exporter.simulator.models import GpuModel

# Legacy DL counters (NVLink 2-4) and NVLink5 counters (Blackwell) the simulator keeps per link.
NVLINK_ERROR_TYPES = ("crc_flit", "crc_data", "replay", "recovery", "ecc")
NVLINK5_ERROR_TYPES = ("rx_errors", "recovery", "recovery_failed", "effective", "symbol")
# Share of a link's bandwidth collectives use while the tensor pipes are busy.
NVLINK_TRAFFIC_SHARE = 0.4
# PCIe bytes/s per generation and lane (after encoding), and the share memory traffic uses.
PCIE_LANE_BYTES = {1: 250e6, 2: 500e6, 3: 985e6, 4: 1969e6, 5: 3938e6, 6: 7563e6}
PCIE_TRAFFIC_SHARE = 0.05
PCIE_IDLE_BYTES_S = 2e6
PCIE_IDLE_GENERATION = 1
PCIE_ERROR_TYPES = (
    "correctable",
    "naks_received",
    "receiver_error",
    "bad_tlp",
    "naks_sent",
    "bad_dllp",
    "non_fatal",
    "fatal",
    "unsupported_request",
    "lcrc",
    "lane",
    "l0_to_recovery",
)
FABRIC_HEALTH = ("healthy", "unhealthy", "limited_capacity")


@dataclass
class NvLink:
    active: bool = True
    errors: dict[str, int] = field(default_factory=dict)
    tx_bytes: float = 0.0
    rx_bytes: float = 0.0


@dataclass
class PcieLink:
    max_generation: int
    max_width: int
    trained_generation: int  # what the link trained to (below max after a downtrain)
    width: int
    replays: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    tx_bytes: float = 0.0
    rx_bytes: float = 0.0

    def generation(self, idle: bool) -> int:
        return min(self.trained_generation, PCIE_IDLE_GENERATION if idle else self.max_generation)


@dataclass
class Fabric:
    kind: str  # nvswitch | nvl
    cluster_uuid: bytes
    clique_id: int
    health: str = "healthy"


@dataclass
class Interconnect:
    nvlinks: list[NvLink]
    pcie: PcieLink
    fabric: Fabric | None
    model: GpuModel

    @classmethod
    def for_model(
        cls, model: GpuModel, cluster_uuid: bytes, clique_id: int, links: int | None = None
    ) -> Interconnect:
        count = model.nvlink.links if model.nvlink else 0
        if links is not None:
            count = links
        pcie = PcieLink(
            model.pcie_generation, model.pcie_width, model.pcie_generation, model.pcie_width
        )
        fabric = None
        if model.fabric == "nvswitch":
            fabric = Fabric("nvswitch", bytes(16), 0)
        elif model.fabric == "nvl":
            fabric = Fabric("nvl", cluster_uuid, clique_id)
        return cls([NvLink() for _ in range(count)], pcie, fabric, model)

    def advance(self, seconds: float, tensor: float, dram: float) -> None:
        """Integrate traffic over an interval with ``tensor``/``dram`` ratio-seconds of activity."""
        if self.model.nvlink is not None:
            per_link = self.model.nvlink.gbps * 1e9 * NVLINK_TRAFFIC_SHARE * tensor
            for link in self.nvlinks:
                if link.active:
                    link.tx_bytes += per_link
                    link.rx_bytes += per_link
        pcie = self.pcie
        lane = PCIE_LANE_BYTES.get(pcie.generation(idle=False), 0.0)
        host = lane * pcie.width * PCIE_TRAFFIC_SHARE * dram + PCIE_IDLE_BYTES_S * seconds
        pcie.tx_bytes += host
        pcie.rx_bytes += host

    def reset(self) -> None:
        """A GPU reset retrains links; error counters survive (they are not volatile)."""
        for link in self.nvlinks:
            link.active = True
        self.pcie.trained_generation = self.pcie.max_generation
        self.pcie.width = self.pcie.max_width
        if self.fabric is not None:
            self.fabric.health = "healthy"


# Field values (nvmlDeviceGetFieldValues) the interconnect answers. Totals over links ignore the
# scope id; per-link fields take the link as scope id (reference/nvml.md).
NVLINK_TOTAL_FIELDS = {38: "crc_flit", 45: "crc_data", 52: "replay", 59: "recovery", 160: "ecc"}
NVLINK5_LINK_FIELDS = {
    208: "rx_errors",
    214: "recovery_failed",
    215: "recovery",
    219: "effective",
    221: "symbol",
}
NVLINK_LINK_COUNT_FIELD = 91
NVLINK_TX_FIELD, NVLINK_RX_FIELD = 138, 139  # KiB, per link (scope UINT_MAX: all links)
ALL_LINKS = 0xFFFFFFFF
PCIE_REPLAY_FIELD, PCIE_ROLLOVER_FIELD = 94, 95
PCIE_ERROR_FIELDS = dict(zip((*range(173, 184), 169), PCIE_ERROR_TYPES, strict=True))
PCIE_TX_FIELD, PCIE_RX_FIELD = 197, 198  # bytes


def field_value(links: Interconnect, field_id: int, scope: int) -> int | None:
    """An interconnect field's integer value; None when it is not one of these fields.

    Raises LookupError for a per-link field whose scope names no link.
    """
    pcie = links.pcie
    if field_id in NVLINK_TOTAL_FIELDS:
        name = NVLINK_TOTAL_FIELDS[field_id]
        return sum(link.errors.get(name, 0) for link in links.nvlinks)
    if field_id == NVLINK_LINK_COUNT_FIELD:
        return len(links.nvlinks)
    if field_id in (NVLINK_TX_FIELD, NVLINK_RX_FIELD) and scope == ALL_LINKS:
        total = sum(
            link.tx_bytes if field_id == NVLINK_TX_FIELD else link.rx_bytes
            for link in links.nvlinks
        )
        return int(total) // 1024
    if field_id in (NVLINK_TX_FIELD, NVLINK_RX_FIELD, *NVLINK5_LINK_FIELDS):
        if not 0 <= scope < len(links.nvlinks):
            raise LookupError(scope)
        link = links.nvlinks[scope]
        if field_id == NVLINK_TX_FIELD:
            return int(link.tx_bytes) // 1024
        if field_id == NVLINK_RX_FIELD:
            return int(link.rx_bytes) // 1024
        return link.errors.get(NVLINK5_LINK_FIELDS[field_id], 0)
    if field_id == PCIE_REPLAY_FIELD:
        return pcie.replays
    if field_id == PCIE_ROLLOVER_FIELD:
        return 0
    if field_id in PCIE_ERROR_FIELDS:
        return pcie.errors.get(PCIE_ERROR_FIELDS[field_id], 0)
    if field_id == PCIE_TX_FIELD:
        return int(pcie.tx_bytes)
    if field_id == PCIE_RX_FIELD:
        return int(pcie.rx_bytes)
    return None


INTERCONNECT_FIELDS = frozenset(
    {
        *NVLINK_TOTAL_FIELDS,
        *NVLINK5_LINK_FIELDS,
        NVLINK_LINK_COUNT_FIELD,
        NVLINK_TX_FIELD,
        NVLINK_RX_FIELD,
        PCIE_REPLAY_FIELD,
        PCIE_ROLLOVER_FIELD,
        *PCIE_ERROR_FIELDS,
        PCIE_TX_FIELD,
        PCIE_RX_FIELD,
    }
)
