"""The exporter's configuration: one frozen value built by the CLI and passed down explicitly.

Every flag is declared here, once, as a field made with :func:`~gpu_exporter.settings.setting`
(flag, value type, default, help, group; the ``GPU_EXPORTER_*`` variable follows the flag's
name). The parser, the environment lookup and the README check derive from these fields; the
``--collector.<name>`` switches and the ``--collector.<name>.<option>`` flags are declared by the
collectors themselves (``collectors/``), and their values arrive here as ``collectors`` and
``collector_options``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .dcgm.target import Target, parse_target
from .logs import LEVELS
from .settings import (
    COUNT,
    DURATION,
    LISTEN,
    PATH,
    RATIO,
    CollectorOptions,
    ValueType,
    choice,
    setting,
)
from .websecurity import WebConfig

DEFAULT_PORT = 9445  # dcgm-exporter uses 9400 and nvidia_gpu_exporter 9835
BUILTIN_SCENARIO = "builtin"
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


@dataclass(frozen=True)
class SimulatorConfig:
    """``scenario`` is None for the built-in scenario."""

    scenario: Path | None = None


def _parse_scenario(text: str) -> SimulatorConfig:
    return SimulatorConfig(None if text == BUILTIN_SCENARIO else Path(text))


SCENARIO = ValueType(_parse_scenario, lambda s: str(s.scenario or BUILTIN_SCENARIO))
DCGM_ADDRESS = ValueType(parse_target, Target.describe, "ADDRESS")


def _parse_pod(text: str) -> tuple[str, str]:
    namespace, sep, name = text.strip().partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"invalid pod {text!r} (use NAMESPACE/NAME)")
    return namespace, name


POD = ValueType(_parse_pod, lambda pod: "/".join(pod), "NAMESPACE/NAME")
DIR = ValueType(Path, str, "DIR")


def _parse_node_name(text: str) -> str:
    name = text.strip()
    if not name or any(c.isspace() or c in ",[]" for c in name):
        raise ValueError(f"invalid Slurm node name {text!r} (one NodeName, no hostlist)")
    return name


NODE_NAME = ValueType(_parse_node_name, str, "NAME")


@dataclass(frozen=True)
class Config:
    listen_host: str = setting(
        "--listen",
        "0.0.0.0",
        LISTEN,
        also=("listen_port",),
        group="serving",
        help="address to serve metrics on",
    )
    listen_port: int = DEFAULT_PORT  # set by --listen
    simulator: SimulatorConfig | None = setting(
        "--simulate",
        None,
        SCENARIO,
        const=BUILTIN_SCENARIO,
        metavar="SCENARIO.yaml",
        none="off",
        group="serving",
        help="run on the simulator instead of NVML; without a file, the built-in 8x H100 node",
    )
    simulate_remote_events: bool = setting(
        "--simulate.remote-events",
        False,
        group="serving",
        help="under --simulate, accept POST /-/simulator/events from any address, not only "
        "from loopback",
    )
    fast_interval: float = setting(
        "--fast-interval",
        1.0,
        DURATION,
        group="sampling",
        help="sampling interval of fast signals: activity, power, clocks...",
    )
    slow_interval: float = setting(
        "--slow-interval",
        30.0,
        DURATION,
        group="sampling",
        help="sampling interval of slow signals: ECC, row remapping, inventory",
    )
    nvml_timeout: float = setting(
        "--nvml-timeout",
        1.0,
        DURATION,
        group="sampling",
        help="give up on a collector's NVML calls for a device after this long",
    )
    collector_durations: bool = setting(
        "--collector-durations",
        False,
        group="sampling",
        help="serve gpu_exporter_collector_duration_seconds, each collector's worker time per "
        "round (diagnosing a slow round; one series per collector)",
    )
    init_timeout: float = 60.0  # not a flag: how long the first nvmlInit may take
    # set by the --collector.<name> switches, which each collector declares (collectors/)
    collectors: frozenset[str] = field(default_factory=frozenset)
    # set by the --collector.<name>.<option> flags, which each collector's module declares
    collector_options: CollectorOptions = field(default_factory=CollectorOptions)
    sysfs_path: Path = setting(
        "--path.sysfs",
        Path("/sys"),
        PATH,
        group="sampling",
        help="the host's sysfs, to count the GPUs on the PCI bus",
    )
    kmsg_path: Path = setting(
        "--kmsg-path",
        Path("/dev/kmsg"),
        PATH,
        group="xid",
        help="kernel log to read Xids from",
    )
    kmsg: bool = setting(
        "--kmsg", True, group="xid", help="read Xids from the kernel log (needs CAP_SYSLOG)"
    )
    nvml_events: bool = setting(
        "--nvml-events", True, group="xid", help="receive Xids as NVML events"
    )
    xid_classes: Path | None = setting(
        "--xid-classes",
        None,
        PATH,
        metavar="FILE",
        group="xid",
        help="YAML file overriding Xid classes, e.g. '94: hardware' (see docs/xid.md)",
    )
    xid_pod_retention: float = setting(
        "--xid-pod-retention",
        7 * 86400.0,
        DURATION,
        group="xid",
        help="withdraw a pod's gpu_xid_errors_total series this long after its latest Xid; the "
        "per-class totals keep its count",
    )
    # None: the default socket, or under --simulate the simulator's own kubelet; given, that
    # socket in either case (a real or stand-in kubelet in front of simulated GPUs).
    pod_resources_socket: Path | None = setting(
        "--pod-resources-socket",
        None,
        PATH,
        none=str(DEFAULT_POD_RESOURCES_SOCKET),
        group="allocation",
        help="kubelet pod-resources socket (under --simulate, given: used instead of the "
        "simulator's kubelet)",
    )
    cdi_spec_dirs: tuple[Path, ...] = setting(
        "--cdi-spec-dir",
        (Path("/var/run/cdi"), Path("/etc/cdi")),
        DIR,
        repeat=True,
        group="allocation",
        help="a directory of CDI spec files, read to resolve GPUs allocated through DRA "
        "(repeatable; GPU_EXPORTER_CDI_SPEC_DIR is comma-separated)",
    )
    nvidia_caps_path: Path = setting(
        "--nvidia-caps-path",
        Path("/proc/driver/nvidia-caps"),
        PATH,
        group="allocation",
        help="the host's /proc/driver/nvidia-caps, whose mig-minors file maps the MIG "
        "capability devices in CDI specs to MIG instances (DRA)",
    )
    self_pod: tuple[str, str] | None = setting(
        "--self-pod",
        None,
        POD,
        group="allocation",
        help="the exporter's own pod, whose allocations (an admin-access DRA claim on every "
        "GPU, say) are not counted; the DaemonSet sets it from the downward API",
    )
    allocation: bool = setting(
        "--allocation",
        True,
        group="allocation",
        help="attribute GPUs to pods through the kubelet pod-resources API",
    )
    pod_resources_interval: float = setting(
        "--pod-resources-interval",
        1.0,
        DURATION,
        group="allocation",
        help="how often to ask the kubelet who holds which GPU",
    )
    allocation_source: str = setting(
        "--allocation.source",
        "pod-resources",
        choice("pod-resources", "slurm", "slurm-job-map"),
        group="allocation",
        help="who says which holder has which GPU: the kubelet (pod-resources), Slurm's scontrol "
        "(slurm), or dcgm-exporter's job-mapping directory (slurm-job-map); docs/slurm.md",
    )
    slurm_job_map_dir: Path = setting(
        "--slurm.job-map-dir",
        Path("/run/dcgm-job-map"),
        DIR,
        group="allocation",
        help="the job-mapping directory the prolog and epilog scripts keep (a file per GPU "
        "index naming its jobs), read with --allocation.source=slurm-job-map",
    )
    slurm_timeout: float = setting(
        "--slurm.timeout",
        10.0,
        DURATION,
        group="allocation",
        help="give up on one scontrol call after this long (the source goes down)",
    )
    slurm_form: str = setting(
        "--slurm.form",
        "auto",
        choice("auto", "json", "text"),
        group="allocation",
        help="scontrol's answer form: JSON (Slurm 23.02+), the text form, or JSON falling back "
        "to text for good once refused",
    )
    slurm_node: str | None = setting(
        "--slurm.node",
        None,
        NODE_NAME,
        group="allocation",
        help="this node's Slurm NodeName (slurmd -N); none: the short host name",
    )
    slurm_interval: float = setting(
        "--slurm.interval",
        5.0,
        DURATION,
        group="allocation",
        help="how often to ask Slurm (or read the mapping directory) which job holds which GPU; "
        "a finished job's series leave within one interval",
    )
    container_memory: bool = setting(
        "--container-memory",
        True,
        group="allocation",
        help="per-container GPU memory from NVML processes, host /proc and pod logs",
    )
    pod_logs_path: Path = setting(
        "--pod-logs-path",
        Path("/var/log/pods"),
        PATH,
        group="allocation",
        help="the host's pod log directory, read for names only",
    )
    state_dir: Path = setting(
        "--state-dir",
        Path("/var/lib/gpu-exporter"),
        PATH,
        metavar="DIR",
        group="xid",
        help="where the Xid journal is kept",
    )
    proc_path: Path = setting(
        "--proc-path",
        Path("/proc"),
        PATH,
        group="allocation",
        help="the host's /proc, for process-to-pod mapping",
    )
    idle_threshold: float = setting(
        "--idle-threshold",
        0.05,
        RATIO,
        group="allocation",
        help="SM activity below which an allocated GPU counts as idle",
    )
    web_config_file: Path | None = setting(
        "--web.config.file",
        None,
        PATH,
        metavar="FILE",
        group="web",
        help="exporter-toolkit web config (TLS, basic auth), as node_exporter's; see "
        "docs/security.md; without one, plain HTTP without authentication",
    )
    web: WebConfig | None = None  # not a flag: loaded from web_config_file by the CLI at start
    web_auth_health: bool = setting(
        "--web.auth-health",
        False,
        group="web",
        help="require the web config's credentials on /healthz and /readyz too (kubelet "
        "probes send none)",
    )
    web_enable_admin_api: bool = setting(
        "--web.enable-admin-api",
        False,
        group="web",
        help="serve POST /-/drain/clear, which clears a GPU's drain recommendation (protect it "
        "with the web config's credentials, see docs/security.md)",
    )
    web_max_requests: int = setting(
        "--web.max-requests",
        40,
        COUNT,
        group="web",
        help="requests served at once; more are answered 503 at once",
    )
    web_read_timeout: float = setting(
        "--web.read-timeout",
        30.0,
        DURATION,
        group="web",
        help="a connection must send a complete request head within this long of opening or of "
        "its previous response, and a request body within this long of its head, else it is "
        "closed; also the keep-alive idle time",
    )
    web_write_timeout: float = setting(
        "--web.write-timeout",
        10.0,
        DURATION,
        group="web",
        help="a response not taken by the client within this long is dropped with its "
        "connection (a client that never reads holds nothing longer)",
    )
    dcgm_address: Target | None = setting(
        "--dcgm.address",
        None,
        DCGM_ADDRESS,
        none="off",
        group="dcgm",
        help="a DCGM host engine (host:port, port 5555 by default, or unix:///path; the GPU "
        "Operator's is nvidia-dcgm.<namespace>.svc:5555) whose profiling fields give SM and "
        "tensor activity on GPUs without GPM (A100, L40S, ...); see docs/deploy.md",
    )
    dcgm_embedded: bool = setting(
        "--dcgm.embedded",
        False,
        group="dcgm",
        help="start a DCGM host engine inside the exporter instead (needs libdcgm.so.4; "
        "conflicts with any other profiling client on the node, dcgm-exporter's own embedded "
        "engine included)",
    )
    log_format: str = setting(
        "--log-format",
        "auto",
        choice("auto", "json", "console"),
        group="logging",
        help="log format; auto = console on a terminal, JSON otherwise",
    )
    log_level: str = setting(
        "--log-level",
        "info",
        choice(*LEVELS),
        group="logging",
        help="the least severe level logged",
    )

    @property
    def simulate(self) -> bool:
        return self.simulator is not None

    @property
    def dcgm_target(self) -> Target | None:
        """The DCGM host engine to use, if any (embedded: a Target without address)."""
        return Target() if self.dcgm_embedded else self.dcgm_address


DEFAULT_LISTEN = f"{Config.listen_host}:{Config.listen_port}"
