"""Timeline events for the interconnect: NVLink links down and errors, PCIe downtraining and
errors, a degraded NVLink fabric, and a GPU that is on the PCI bus but missing from NVML."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gpu_exporter.simulator.links import NvLink

if TYPE_CHECKING:
    from gpu_exporter.simulator.devices import GpuDevice


class LinkEvents:
    """Mixed into :class:`~gpu_exporter.simulator.node.SimulatedNode` (``_on_<type>`` handlers)."""

    gpus: list[GpuDevice]
    init_count: int

    def _link_targets(self, p: Mapping[str, Any]) -> Iterable[tuple[GpuDevice, NvLink]]:
        for i in p["gpus"]:
            gpu = self.gpus[i]
            links = gpu.links.nvlinks
            chosen = range(len(links)) if p["links"] == "all" else p["links"]
            for link in chosen:
                yield gpu, links[link]

    def _on_nvlink_down(self, p: Mapping[str, Any], t: float) -> None:
        for _, link in self._link_targets(p):
            link.active = False

    def _on_nvlink_up(self, p: Mapping[str, Any], t: float) -> None:
        for _, link in self._link_targets(p):
            link.active = True

    def _on_nvlink_errors(self, p: Mapping[str, Any], t: float) -> None:
        for _, link in self._link_targets(p):
            for kind, count in p["counts"].items():
                if count:
                    link.errors[kind] = link.errors.get(kind, 0) + count

    def _on_pcie_downtrain(self, p: Mapping[str, Any], t: float) -> None:
        for i in p["gpus"]:
            pcie = self.gpus[i].links.pcie
            pcie.width, pcie.trained_generation = p["width"], p["generation"]

    def _on_pcie_errors(self, p: Mapping[str, Any], t: float) -> None:
        for i in p["gpus"]:
            pcie = self.gpus[i].links.pcie
            for kind, count in p["counts"].items():
                if kind == "replays":
                    pcie.replays += count
                elif count:
                    pcie.errors[kind] = pcie.errors.get(kind, 0) + count

    def _on_fabric_degraded(self, p: Mapping[str, Any], t: float) -> None:
        for i in p["gpus"]:
            fabric = self.gpus[i].links.fabric
            if fabric is not None:
                fabric.health = p["health"]

    def _on_gpu_missing_at_boot(self, p: Mapping[str, Any], t: float) -> None:
        """Only before NVML is first initialised: a running driver's GPU list does not shrink."""
        if self.init_count:
            return
        for i in p["gpus"]:
            self.gpus[i].missing = True
