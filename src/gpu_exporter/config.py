"""The exporter's configuration: one frozen value built by the CLI and passed down explicitly."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .webconfig import WebConfig

DEFAULT_PORT = 9445  # dcgm-exporter uses 9400 and nvidia_gpu_exporter 9835
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"


@dataclass(frozen=True)
class SimulatorConfig:
    """``scenario`` is None for the built-in scenario."""

    scenario: Path | None = None


@dataclass(frozen=True)
class Config:
    listen_host: str = "0.0.0.0"
    listen_port: int = DEFAULT_PORT
    simulator: SimulatorConfig | None = None
    fast_interval: float = 1.0
    slow_interval: float = 30.0
    nvml_timeout: float = 1.0
    init_timeout: float = 60.0
    collectors: frozenset[str] = field(default_factory=frozenset)
    kmsg_path: Path = Path("/dev/kmsg")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    state_dir: Path = Path("/var/lib/gpu-exporter")
    proc_path: Path = Path("/proc")
    xid_classes: Path | None = None
    xid_pod_retention: float = 7 * 86400.0
    kmsg: bool = True
    nvml_events: bool = True
    allocation: bool = True
    container_memory: bool = True
    pod_logs_path: Path = Path("/var/log/pods")
    pod_resources_interval: float = 1.0
    idle_threshold: float = 0.05
    web_config_file: Path | None = None
    web: WebConfig | None = None  # loaded from web_config_file by the CLI at start
    web_auth_health: bool = False
    web_enable_admin_api: bool = False
    web_max_requests: int = 40
    web_read_timeout: float = 30.0
    log_format: str = "auto"
    log_level: str = "info"

    @property
    def simulate(self) -> bool:
        return self.simulator is not None
