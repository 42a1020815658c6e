"""Timeline, NVML Xid events, kernel-log records (Xid, NVSwitch SXid) and allocation changes."""

from __future__ import annotations

import ctypes
import pathlib
import threading

import pynvml
import pytest

from gpu_exporter.simulator import ScenarioError, SimulatedNode, install, loads_scenario, uninstall
from gpu_exporter.simulator.kubelet import SimulatedKubelet

from .sim_helpers import FakeClock, MakeNode

NODE = """
node: {name: events-node, uptime: 100s}
gpus:
  - {model: H100-SXM-80GB, count: 2}
  - {model: H100-SXM-80GB, mig: [3g.40gb, 4g.40gb]}
workloads:
  - {gpu: 0, pod: web, namespace: prod, pid: 4242, process_name: python3, sm: 0.5}
"""


TIMELINE_XID_SOON = "timeline:\n  - {at: 200ms, type: xid, gpu: 0, code: 31}\n"


def xid_set(*gpus: int) -> object:
    event_set = pynvml.nvmlEventSetCreate()
    for gpu in gpus:
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    return event_set


def test_xid_arrives_as_event_and_kernel_log_line(make_node: MakeNode, clock: FakeClock) -> None:
    node = make_node(NODE + "timeline:\n  - {at: 90s, type: xid, gpu: 0, code: 13}\n")
    event_set = xid_set(0, 1)
    clock.advance(89)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)
    clock.advance(1)
    data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
    assert (data.eventData, data.gpuInstanceId, data.computeInstanceId) == (
        13,
        0xFFFFFFFF,
        0xFFFFFFFF,
    )
    (record,) = node.kmsg_lines
    assert record.startswith("3,1200,190000000,-;NVRM: Xid (PCI:0000:18:00): 13, ")
    assert "pid=4242, name=python3, Graphics SM Warp Exception" in record


def test_xid_79_is_kernel_log_only_by_default(make_node: MakeNode) -> None:
    node = make_node(NODE)
    event_set = xid_set(1)
    node.inject({"type": "xid", "gpu": 1, "code": 79})
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)
    assert node.kmsg_lines[-1].endswith(
        "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus."
    )
    node.inject({"type": "xid", "gpu": 1, "code": 79, "delivery": "nvml"})
    assert pynvml.nvmlEventSetWait_v2(event_set, 0).eventData == 79


def test_mig_xid_names_the_instance(make_node: MakeNode) -> None:
    node = make_node(NODE)
    event_set = xid_set(2)
    node.inject({"type": "xid", "gpu": 2, "mig": 1, "code": 31, "pid": 77})
    data = pynvml.nvmlEventSetWait_v2(event_set, 0)
    assert (data.gpuInstanceId, data.computeInstanceId) == (2, 0)
    assert "Xid (PCI:0000:3a:00 GPU-I:02): 31, pid=77, name=python," in node.kmsg_lines[-1]


def test_a_non_root_caller_gets_mig_xid_events_without_the_instance(make_node: MakeNode) -> None:
    node = make_node(NODE.replace("uptime: 100s}", "uptime: 100s, privileged: false}"))
    event_set = xid_set(2)
    node.inject({"type": "xid", "gpu": 2, "mig": 1, "code": 31, "pid": 77})
    data = pynvml.nvmlEventSetWait_v2(event_set, 0)
    assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert "GPU-I:02" in node.kmsg_lines[-1], "the kernel log still names the instance"


def test_sxid_is_a_kernel_log_line_only(make_node: MakeNode) -> None:
    node = make_node(NODE)
    event_set = pynvml.nvmlEventSetCreate()
    for gpu in range(3):
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
        pynvml.nvmlDeviceRegisterEvents(handle, supported, event_set)
    node.inject(
        {
            "type": "sxid",
            "switch": 3,
            "code": 12028,
            "link": 32,
            "message": "egress non-posted PRIV error",
        }
    )
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)
    zeros = ", ".join(["0x00000000"] * 9)
    assert node.kmsg_lines == [
        "3,1200,100000000,-;nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 12028, Non-fatal, "
        "Link 32 egress non-posted PRIV error",
        # What the driver adds for an error it records (nvswitch_record_error), same code.
        "3,1201,100000000,-;nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 12028, Severity 0 "
        "Engine instance 32 Sub-engine instance 00",
        f"3,1202,100000000,-;nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 12028, Data {{{zeros}}}",
    ]


def test_fatal_sxid_from_the_timeline(make_node: MakeNode, clock: FakeClock) -> None:
    node = make_node(
        NODE
        + "timeline:\n"
        + "  - {at: 1m, type: sxid, switch: 2, code: 24007, severity: fatal, link: 5,"
        + " message: sourcetrack timeout error}\n"
    )
    clock.advance(59)
    assert node.kmsg_lines == []
    clock.advance(1)
    assert node.kmsg_lines[0] == (
        "3,1200,160000000,-;nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 24007, Fatal, "
        "Link 05 sourcetrack timeout error"
    )
    assert "24007, Severity 1 Engine instance 05" in node.kmsg_lines[1], "1 is fatal"


def test_sxid_codes_are_printed_with_five_digits_and_correctable_is_a_severity(
    make_node: MakeNode,
) -> None:
    node = make_node(NODE)
    node.inject({"type": "sxid", "switch": 1, "code": 1004, "severity": "correctable"})
    assert "SXid (PCI:0000:06:00.0): 01004, Correctable, Link 00 error" in node.kmsg_lines[0]


def test_sxid_defaults(make_node: MakeNode) -> None:
    node = make_node(NODE)
    node.inject({"type": "sxid", "switch": 0, "code": 20034})
    assert node.kmsg_lines[0].endswith(
        ";nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Non-fatal, Link 00 error"
    )
    assert node.applied[-1] == {"t": 0.0, "type": "sxid", "switch": 0, "code": 20034}


@pytest.mark.parametrize(
    ("switch", "bus"),
    [(0, "0000:05:00.0"), (3, "0000:08:00.0"), (10, "0000:0f:00.0"), (11, "0000:10:00.0"),
     (15, "0000:14:00.0")],
)  # fmt: skip
def test_sxid_names_the_switch_pci_address(make_node: MakeNode, switch: int, bus: str) -> None:
    node = make_node(NODE)
    node.inject({"type": "sxid", "switch": switch, "code": 11004, "severity": "fatal"})
    expected = f";nvidia-nvswitch{switch}: SXid (PCI:{bus}): 11004, Fatal, Link 00 error"
    assert node.kmsg_lines[0].endswith(expected)


def test_wait_is_woken_from_another_thread(make_node: MakeNode) -> None:
    node = make_node(NODE)
    event_set = xid_set(0)
    waiting = threading.Event()
    received: list[int] = []

    def wait() -> None:
        waiting.set()
        received.append(pynvml.nvmlEventSetWait_v2(event_set, 10_000).eventData)

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiting.wait()
    node.inject({"type": "xid", "gpu": 0, "code": 43})
    waiter.join(5)
    assert received == [43]


def test_a_wait_wakes_when_the_timeline_has_an_event_due() -> None:
    """Nothing else calls in: the blocked wait itself sleeps until the Xid is due (real clock),
    as a driver's wait sleeps in the kernel, instead of polling the timeline."""
    node = SimulatedNode(loads_scenario(NODE + TIMELINE_XID_SOON, "soon.yaml"))
    install(node)
    received: list[int] = []
    try:
        pynvml.nvmlInit()
        event_set = xid_set(0)
        waiter = threading.Thread(
            target=lambda: received.append(pynvml.nvmlEventSetWait_v2(event_set, 60_000).eventData)
        )
        waiter.start()
        waiter.join(10)
        assert received == [31], "the wait did not wake when the timeline's Xid fell due"
    finally:
        uninstall()
        node.close()


def test_lost_gpu_interrupts_a_wait(make_node: MakeNode) -> None:
    node = make_node(NODE)
    event_set = xid_set(1)
    node.inject({"type": "gpu_lost", "gpu": 1})
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlEventSetWait_v2(event_set, 0)


def test_kmsg_sinks_and_files(make_node: MakeNode, tmp_path: pathlib.Path) -> None:
    node = make_node(NODE)
    seen: list[str] = []
    node.add_kmsg_sink(seen.append)
    node.add_kmsg_file(tmp_path / "kmsg")
    node.inject({"type": "xid", "gpu": 0, "code": 48, "delivery": "kmsg"})
    assert seen == node.kmsg_lines
    assert (tmp_path / "kmsg").read_text() == seen[0] + "\n"


def test_repeating_events(make_node: MakeNode, clock: FakeClock) -> None:
    node = make_node(
        NODE + "timeline:\n  - {at: 1m, repeat: every 2m, type: ecc, gpu: 1, corrected: 1}\n"
    )
    clock.advance(60 * 7)
    node.advance()
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetTotalEccErrors(handle, 0, 1) == 4  # at 1, 3, 5 and 7 minutes


def test_allocate_and_release(make_node: MakeNode, clock: FakeClock) -> None:
    node = make_node(
        NODE
        + """
timeline:
  - at: 10s
    type: allocate
    gpu: 1
    replica: 0
    pod: batch-1
    namespace: jobs
    workload: {pid: 999, memory: 1GiB, sm: 0.4}
  - {at: 20s, type: release, pod: batch-1, namespace: jobs}
"""
    )
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert node.allocations == []
    clock.advance(10)
    (allocation,) = node.allocations
    assert allocation.device_id == pynvml.nvmlDeviceGetUUID(handle) + "::0"
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)] == [999]
    clock.advance(10)
    assert node.allocations == []
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle) == []


def test_processes_start_and_stop_without_an_allocation(
    make_node: MakeNode, tmp_path: pathlib.Path
) -> None:
    """A job over SSH and a deleted pod's zombie start at an event and end at another: NVML lists
    them meanwhile, the kubelet never lists the zombie's pod, and the rest of the node stays."""
    node = make_node(NODE)
    kubelet = SimulatedKubelet(node, files_root=tmp_path)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    applied = node.inject_many(
        [
            {"type": "workload_start", "gpu": 0, "host": True, "pid": 5001, "memory": "1GiB"},
            {
                "type": "workload_start",
                "gpu": 0,
                "pod": "old",
                "namespace": "batch",
                "pid": 5002,
                "memory": "2GiB",
                "deleted": True,
            },
        ],
        "<test>",
    )
    assert [a["type"] for a in applied] == ["workload_start", "workload_start"]
    listed = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    assert listed == {4242: 0, 5001: 1 << 30, 5002: 2 << 30}
    assert kubelet.state().running == [("prod", "web", "main")], "a deleted pod is not listed"
    node.inject({"type": "workload_stop", "pid": 5002})
    node.inject({"type": "workload_stop", "pid": 5001})
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)] == [4242]


@pytest.mark.parametrize(
    ("event", "error"),
    [
        ({"type": "workload_start", "gpu": 0}, "<test>: pid: required key is missing"),
        (
            {"type": "workload_start", "gpu": 0, "pid": 7, "host": True, "pod": "p"},
            "<test>: pod: a host process (host: true) has no pod",
        ),
        ({"type": "workload_stop"}, "<test>: pid: required key is missing"),
    ],
)
def test_a_process_event_without_what_it_needs_is_refused(
    make_node: MakeNode, event: dict[str, object], error: str
) -> None:
    node = make_node(NODE)
    with pytest.raises(ScenarioError) as caught:
        node.inject_many(event, "<test>")
    assert str(caught.value) == error


def test_the_kubelets_reads_wait_for_no_nvml_call_between_events(
    make_node: MakeNode, clock: FakeClock, tmp_path: pathlib.Path
) -> None:
    """The simulated kubelet reads the node on the exporter's event loop. Between events those
    reads take no lock (an NVML call on a worker holds it); an event shows at the next read."""
    node = make_node(
        NODE + "timeline:\n  - {at: 10s, type: allocate, gpu: 1, pod: batch-1, namespace: jobs}\n"
    )
    kubelet = SimulatedKubelet(node, files_root=tmp_path)
    before = kubelet.state()
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:  # as a hung NVML call would
        with node.lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    read: list[object] = []
    try:
        assert held.wait(5)
        reader = threading.Thread(target=lambda: read.extend((node.allocations, kubelet.state())))
        reader.start()
        reader.join(5)
        assert not reader.is_alive(), "a read between events waited for the node's lock"
    finally:
        release.set()
        holder.join()
    assert read == [[], before], "a read between events did not answer what was last listed"

    clock.advance(10)
    (allocation,) = node.allocations
    after = kubelet.state()
    assert after is not before, "the kubelet kept its listing across an allocate event"
    assert [(c.pod, c.device_ids) for c in after.containers] == [
        ("batch-1", (allocation.device_id,))
    ]


def test_recovery_action_and_remap_failure(make_node: MakeNode) -> None:
    node = make_node(NODE)
    node.inject({"type": "recovery_action", "gpu": 0, "action": "drain_and_reset"})
    node.inject({"type": "row_remap_failure", "gpu": 0})
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    (field,) = pynvml.nvmlDeviceGetFieldValues(handle, [230])
    assert field.value.uiVal == pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    assert pynvml.nvmlDeviceGetRemappedRows(handle)[3] == 1


def test_a_lost_gpu_does_not_disturb_sets_watching_other_gpus(make_node: MakeNode) -> None:
    node = make_node(NODE)
    event_set = xid_set(0)
    node.inject({"type": "gpu_lost", "gpu": 1})
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(event_set, 0)


def test_a_mig_reconfiguration_reuses_slot_handles_for_new_instances(make_node: MakeNode) -> None:
    node = make_node(NODE)
    parent = pynvml.nvmlDeviceGetHandleByIndex(2)
    before = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    old_uuid = pynvml.nvmlDeviceGetUUID(before)
    node.inject({"type": "mig_reconfigure", "gpu": 2, "mig": ["1g.10gb", "1g.10gb", "2g.20gb"]})
    after = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert ctypes.addressof(after.contents) == ctypes.addressof(before.contents)
    assert pynvml.nvmlDeviceGetUUID(before) != old_uuid, "the old handle names the new instance"
    assert pynvml.nvmlDeviceGetName(before).endswith("MIG 1g.10gb")
    assert pynvml.nvmlDeviceGetMemoryInfo(before).total == 9856 * 2**20
    assert (
        pynvml.nvmlDeviceGetGpuInstanceId(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2))
        == 3
    )
    with pytest.raises(ScenarioError, match=r"gpu 0 is not in MIG mode"):
        node.inject({"type": "mig_reconfigure", "gpu": 0, "mig": []})
