"""Builds the running exporter from a frozen :class:`Config` (the one place that wires parts)."""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import signal
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from aiohttp import web

from .config import Config
from .dcgm.readings import DcgmLink
from .host import Host
from .http.admin import admin_routes
from .http.listener import WebServer, listen
from .http.server import make_web_app
from .http.status import UnheldProcess
from .http.webguard import RequestGuard
from .http.webreload import WebConfigReloader
from .ledger import ActivityLedger
from .logs import get_logger
from .migprofiles import MigProfileBook
from .nvml import ErrorCounter, WorkerPool
from .pci import ExpectedGpus
from .sampler import Sampler, SamplerSettings
from .xid import XidSettings, XidSubsystem

if TYPE_CHECKING:  # imported when built: ~2.5 MiB RSS (h2, the subsystem); not with --no-allocation
    from .allocation.jobgpus import JobSource
    from .allocation.subsystem import AllocationSubsystem
    from .dcgm.service import DcgmService  # with the binding: only with --dcgm.*

_log = get_logger("app")


@dataclass
class Exporter:
    """The parts of a running exporter, started and stopped together."""

    config: Config
    host: Host  # where its inputs come from: this machine, or a simulated node
    pool: WorkerPool
    sampler: Sampler
    web_app: web.Application
    xid: XidSubsystem
    guard: RequestGuard  # limits and authentication of every request
    allocation: AllocationSubsystem | None = None
    web_server: WebServer | None = None  # once started
    web_config: WebConfigReloader | None = None  # with --web.config.file
    web_workers: ThreadPoolExecutor | None = None  # web config reads and bcrypt (web side's own)
    dcgm: DcgmService | None = None  # with --dcgm.address or --dcgm.embedded

    @property
    def port(self) -> int:
        """The bound port (useful with ``--listen 127.0.0.1:0``)."""
        if self.web_server is None:
            raise RuntimeError("exporter is not listening")
        return self.web_server.port

    async def start(self) -> None:
        await self.host.start()
        await self.sampler.start()  # NVML up and devices known before the other sources start
        if self.dcgm is not None:
            await self.dcgm.start()
        if self.allocation is not None:
            await self.allocation.start()
        await self.xid.start()
        # Starting (the imports, discovery, the first rounds' state) promotes tens of thousands
        # of objects to the collector's old generation. A full collection traverses all of them
        # with the GIL held (30-60 ms); run the one that is due now, before the first request,
        # rather than minutes later in the middle of serving. The collector's settings are
        # left as they are.
        gc.collect()
        self.web_server = await start_web_server(self.web_app, self.config, self.guard)
        if self.web_config is not None:
            self.web_config.start()

    async def stop(self) -> None:
        """Stop every part, in order, even when one of them fails to stop cleanly."""
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        if self.web_config is not None:
            steps.append(("web config reloads", self.web_config.stop))
        if self.web_server is not None:
            steps.append(("http", self.web_server.stop))
        steps.append(("xid", self.xid.stop))  # frees its NVML event set before nvmlShutdown
        if self.allocation is not None:
            steps.append(("allocation", self.allocation.stop))
        if self.dcgm is not None:
            steps.append(("dcgm", self.dcgm.stop))
        steps.append(("sampler", self.sampler.stop))
        for name, step in steps:
            await _stop_part(name, step)
        if self.web_workers is not None:
            self.web_workers.shutdown(wait=False, cancel_futures=True)
        self.pool.shutdown()
        await _stop_part("host", self.host.close)


async def _stop_part(name: str, step: Callable[[], Awaitable[None]]) -> None:
    try:
        await step()
    except Exception:  # keep stopping the rest; the process is on its way out
        _log.exception("stop failed", part=name)


async def start_web_server(
    web_app: web.Application, config: Config, guard: RequestGuard
) -> WebServer:
    """Serve ``web_app`` on ``--listen`` with the ``--web.*`` settings."""
    return await listen(
        web_app,
        guard,
        (config.listen_host, config.listen_port),
        config.web,
        read_timeout=config.web_read_timeout,
    )


def build_exporter(config: Config, host: Host) -> Exporter:
    """Wire every part from ``config``, reading the node through ``host``; nothing starts until
    :meth:`Exporter.start`."""
    pool = WorkerPool(size=_pool_size())
    # State several parts share, created here and handed to each part that reads or writes it:
    # the collectors' activity integrals and MIG profile tables (allocation accounts and
    # right-sizes from them), the NVML error counts (process listing calls NVML too), and which
    # devices DCGM serves with its readings (the DCGM service writes it; discovery and the
    # activity collectors read it).
    ledger = ActivityLedger()
    mig_profiles = MigProfileBook()
    errors = ErrorCounter()
    dcgm_link = DcgmLink()
    sampler = Sampler(
        sampler_settings(config),
        pool,
        ledger=ledger,
        mig_profiles=mig_profiles,
        errors=errors,
        dcgm=dcgm_link,
    )
    sampler.add_source(ExpectedGpus(host.sysfs_path, lambda: _visible_gpus(sampler)))
    allocation = None
    if config.allocation:
        allocation = _build_allocation(
            config, host, sampler, pool, ledger=ledger, mig_profiles=mig_profiles, errors=errors
        )
        sampler.add_source(allocation, frozen=True)  # its samples read the published snapshot
        sampler.add_round_listener(allocation)
    dcgm = _build_dcgm(config, host, sampler, pool, dcgm_link)
    if dcgm is not None:
        sampler.add_source(dcgm)
    xid = _build_xid(config, host, sampler, allocation)
    sampler.add_source(xid)
    sampler.add_listener(xid)
    # Web config reloads and bcrypt on threads of their own: what they wait on (a file, a login
    # flood) must not take the default executor's threads that the rest of the exporter needs.
    # One reload and one bcrypt run at a time (webreload, webguard), so two threads never queue.
    web_workers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="web")
    guard = RequestGuard(
        config.web,
        max_requests=config.web_max_requests,
        auth_health=config.web_auth_health,
        read_timeout=config.web_read_timeout,
        write_timeout=config.web_write_timeout,
        executor=web_workers,
    )
    sampler.add_source(guard)
    web_config = None
    if config.web is not None:
        web_config = WebConfigReloader(config.web, guard.apply, executor=web_workers)
        sampler.add_source(web_config)
    extra_routes = list(host.routes)
    if config.web_enable_admin_api:
        checked = bool(config.web and config.web.auth_required)
        extra_routes += admin_routes(xid, credentials_checked=checked)
    processes = partial(_unheld_processes, allocation) if allocation is not None else None
    web_app = make_web_app(sampler, extra_routes, guard, processes)
    return Exporter(
        config,
        host,
        pool,
        sampler,
        web_app,
        xid,
        guard,
        allocation,
        web_config=web_config,
        web_workers=web_workers,
        dcgm=dcgm,
    )


def sampler_settings(config: Config) -> SamplerSettings:
    """The sampler's part of ``config`` (also how tests and the benchmark build a sampler)."""
    return SamplerSettings(
        collectors=config.collectors,
        collector_options=config.collector_options,
        fast_interval=config.fast_interval,
        slow_interval=config.slow_interval,
        nvml_timeout=config.nvml_timeout,
        init_timeout=config.init_timeout,
        collector_durations=config.collector_durations,
    )


def _build_dcgm(
    config: Config, host: Host, sampler: Sampler, pool: WorkerPool, link: DcgmLink
) -> DcgmService | None:
    """The DCGM activity source, on the host's DCGM library."""
    target = config.dcgm_target
    if target is None:
        return None
    from .dcgm.service import DcgmService

    return DcgmService(
        library=host.dcgm_library,
        target=target,
        devices=sampler.devices,
        link=link,
        executor=pool,
        interval=config.fast_interval,
        call_timeout=max(2 * config.nvml_timeout, 5.0),
    )


def _pool_size() -> int:
    """One worker per CPU this process may run on, 2 to 16.

    NVML releases the GIL in the driver, so workers overlap devices' calls; but the driver's
    side of a call is CPU time too, and a worker beyond the CPUs can only wait for one, or for
    the GIL. A worker waiting for the GIL is one more that the event loop queues behind: the
    interpreter hands the GIL on after its switch interval (5 ms) to whichever thread waited
    longest, so the loop's longest wait grows with the workers that run Python at once
    (docs/performance.md, "Longest event-loop stall"). At least 2, so that one hung call never
    holds up every other device until the round gives up on it. The CPUs are the affinity
    mask's (a pinned container's cpuset), not the host's count."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks on this platform (macOS)
        cpus = os.cpu_count() or 2
    return max(2, min(16, cpus))


def _visible_gpus(sampler: Sampler) -> int | None:
    system = sampler.system
    return system.gpu_count if system is not None else None


def _unheld_processes(allocation: AllocationSubsystem) -> dict[str, tuple[UnheldProcess, ...]]:
    """The status page's processes: each device's GPU processes that do not hold it."""
    found: dict[str, list[UnheldProcess]] = {}
    for p in allocation.processes:
        if p.process_class != "held":
            namespace, pod = p.pod or ("", "")
            process, used = p.process, p.process.used_bytes
            memory = None if used is None else float(used)
            row = UnheldProcess(
                process.pid, p.process_class, process.command, namespace, pod, memory
            )
            found.setdefault(p.device.uuid, []).append(row)
    return {uuid: tuple(rows) for uuid, rows in found.items()}


def _build_allocation(
    config: Config,
    host: Host,
    sampler: Sampler,
    pool: WorkerPool,
    *,
    ledger: ActivityLedger,
    mig_profiles: MigProfileBook,
    errors: ErrorCounter,
) -> AllocationSubsystem:
    from .allocation.subsystem import AllocationSettings, AllocationSubsystem

    jobs, poll_interval, call_timeout = _slurm_source(config)
    settings = AllocationSettings(
        socket_path=host.pod_resources_socket,
        proc_path=host.proc_path,
        pod_logs_path=host.pod_logs_path,
        cdi_spec_dirs=tuple(host.cdi_spec_dirs),
        mig_minors_path=host.nvidia_caps_path / "mig-minors",
        sysfs_path=host.sysfs_path,
        self_pod=config.self_pod,
        idle_threshold=config.idle_threshold,
        poll_interval=poll_interval,
        process_interval=5.0 if config.container_memory else None,
        call_timeout=call_timeout,
        allocatable_interval=config.slow_interval,
        phase=config.fast_interval / 2,  # between the sampler's rounds
    )
    return AllocationSubsystem(
        settings,
        devices=sampler.devices,
        ledger=ledger,
        mig_profiles=mig_profiles,
        errors=errors,
        executor=pool,
        jobs=jobs,
    )


def _slurm_source(config: Config) -> tuple[JobSource | None, float, float]:
    """The holder source's reader (None: the kubelet), poll interval and call timeout:
    --allocation.source=slurm or slurm-job-map read Slurm at its own cadence."""
    if config.allocation_source == "pod-resources":
        return None, config.pod_resources_interval, 2.0
    from .allocation.jobmap import JobMapReader
    from .allocation.slurm import SlurmForm, SlurmReader, local_node_name

    jobs: JobSource
    if config.allocation_source == "slurm-job-map":
        jobs = JobMapReader(config.slurm_job_map_dir)
    else:
        node = config.slurm_node or local_node_name()
        form = SlurmForm(config.slurm_form)
        jobs = SlurmReader(node, form=form, timeout=config.slurm_timeout)
    # The worker-pool wait outlasts scontrol's own timeout, which ends the command first.
    return jobs, config.slurm_interval, config.slurm_timeout + 1.0


def _build_xid(
    config: Config, host: Host, sampler: Sampler, allocation: AllocationSubsystem | None
) -> XidSubsystem:
    settings = XidSettings(
        kmsg_path=host.kmsg_path if config.kmsg else None,
        state_dir=host.state_dir,
        proc_path=host.proc_path,
        classes_path=config.xid_classes,
        pod_series_retention=config.xid_pod_retention,
        job_holders=config.allocation_source != "pod-resources",
        nvml_events=config.nvml_events,
        boot_id=host.boot_id,
    )
    return XidSubsystem(
        settings,
        devices=sampler.devices,
        unidentified_lost=sampler.unidentified_lost,
        holders=None if allocation is None else allocation.holders,
        on_change=sampler.note_news,
    )


async def run_until_signalled(exporter: Exporter) -> None:
    """Run until SIGTERM or SIGINT, then stop everything cleanly. SIGHUP reads the web config
    again at once (ignored without one), as exporter-toolkit's users expect; it never stops."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, functools.partial(_on_sighup, exporter))
    try:
        await exporter.start()
        await stop.wait()
        _log.info("shutting down")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with suppress(Exception):
                loop.remove_signal_handler(signum)
        await exporter.stop()


def _on_sighup(exporter: Exporter) -> None:
    if exporter.web_config is None:
        _log.info("SIGHUP ignored: no --web.config.file to read again")
        return
    exporter.web_config.reload_on_signal()
