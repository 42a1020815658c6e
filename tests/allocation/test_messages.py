"""The pod-resources answers: what the exporter reads and what the simulated kubelet writes.

The client decodes with protobuf's runtime and the generated classes (``proto/podresources_pb2``);
what any protobuf writer sends (fields the exporter never reads included) reads back as the
holdings it was built from, what the simulated kubelet writes reads back the same, and bytes
that are not such a message are an error, never a partial answer.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from gpu_exporter.allocation.podresources import (
    GET,
    GET_ALLOCATABLE,
    LIST,
    ClaimDevice,
    ContainerCpus,
    ContainerDevices,
    read_allocatable,
    read_list,
    read_pods,
)
from gpu_exporter.allocation.proto import podresources_pb2 as pb
from gpu_exporter.simulator.podresources_server import allocatable_response, list_response


def test_the_calls_are_the_protos_methods() -> None:
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    paths = {f"/{service.full_name}/{m.name}" for m in service.methods}
    assert {LIST, GET_ALLOCATABLE, GET} == paths
    assert LIST == "/v1.PodResourcesLister/List"


names = st.text(max_size=12)
ids = st.lists(names, max_size=3).map(tuple)
where = st.tuples(st.sampled_from(["ns-a", "ns-b", ""]), st.sampled_from(["p1", "p2"]), names)
plugin_devices = st.lists(
    st.builds(lambda w, r, d: ContainerDevices(*w, r, d), where, names, ids), max_size=6
)
claim_devices = st.lists(
    st.builds(
        lambda w, claim, device, cdi, share: ClaimDevice(
            *w, claim[0], claim[1], device[0], device[1], device[2], cdi, share
        ),
        where,
        st.tuples(names, st.sampled_from(["claim-1", "claim-2"])),
        st.tuples(names, names, names),
        ids,
        st.none() | names,
    ),
    max_size=6,
)


def by_protobuf(
    containers: Sequence[ContainerDevices], claims: Sequence[ClaimDevice]
) -> pb.ListPodResourcesResponse:
    """The same holdings as protobuf builds them, with the fields the exporter never reads."""
    response = pb.ListPodResourcesResponse()
    for entry in containers:
        pod = response.pod_resources.add(name=entry.pod, namespace=entry.namespace, cpu_ids=[3])
        container = pod.containers.add(name=entry.container, cpu_ids=[1, 2])
        container.memory.add(memory_type="memory", size=1 << 30)
        devices = container.devices.add(resource_name=entry.resource)
        devices.device_ids.extend(entry.device_ids)
        devices.topology.nodes.add(ID=1)
    for claim in claims:
        pod = response.pod_resources.add(name=claim.pod, namespace=claim.namespace)
        dynamic = pod.containers.add(name=claim.container).dynamic_resources.add(
            claim_name=claim.claim_name, claim_namespace=claim.claim_namespace
        )
        resource = dynamic.claim_resources.add(
            driver_name=claim.driver, pool_name=claim.pool, device_name=claim.device
        )
        resource.cdi_devices.extend(pb.CDIDevice(name=n) for n in claim.cdi_devices)
        if claim.share_id is not None:
            resource.share_id = claim.share_id
    return response


def same(a: Sequence[object], b: Sequence[object]) -> bool:
    return sorted(map(repr, a)) == sorted(map(repr, b))


@given(plugin_devices, claim_devices)
def test_what_protobuf_writes_reads_back_as_the_holdings(
    containers: list[ContainerDevices], claims: list[ClaimDevice]
) -> None:
    read_containers, read_claims = read_list(by_protobuf(containers, claims).SerializeToString())
    assert same(read_containers, containers)
    assert same(read_claims, claims)


@given(plugin_devices, claim_devices)
def test_what_the_simulated_kubelet_writes_protobuf_reads_back(
    containers: list[ContainerDevices], claims: list[ClaimDevice]
) -> None:
    written = list_response(containers, claims).SerializeToString()
    parsed = pb.ListPodResourcesResponse.FromString(written)
    assert same(read_list(written)[0], containers)
    assert same(read_list(written)[1], claims)
    keys = [(p.namespace, p.name) for p in parsed.pod_resources]
    assert len(keys) == len(set(keys)), "one PodResources per pod, as the kubelet groups them"


@given(st.lists(st.tuples(st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]), names)))
def test_allocatable_devices_both_ways(allocatable: list[tuple[str, str]]) -> None:
    written = allocatable_response(allocatable).SerializeToString()
    parsed = pb.AllocatableResourcesResponse.FromString(written)
    assert same([(d.resource_name, i) for d in parsed.devices for i in d.device_ids], allocatable)
    assert same(read_allocatable(written), allocatable)


def test_a_share_id_set_to_empty_is_not_absent() -> None:
    claim = ClaimDevice("ns", "p", "c", "ns", "claim", "gpu.nvidia.com", "node", "gpu-0", (), "")
    written = list_response([], [claim]).SerializeToString()
    parsed = pb.ListPodResourcesResponse.FromString(written)
    resource = parsed.pod_resources[0].containers[0].dynamic_resources[0].claim_resources[0]
    assert resource.HasField("share_id")
    assert read_list(written)[1] == [claim]


def test_cpu_ids_and_memory_nodes_are_read_per_container_as_the_kubelet_lists_them() -> None:
    # What a kubelet with the static CPU manager and the memory manager sends: a container's
    # memory per type (memory, hugepages), each with its NUMA nodes.
    node = pb.TopologyInfo(nodes=[pb.NUMANode(ID=1)])
    container = pb.ContainerResources(
        name="trainer",
        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-a"])],
        cpu_ids=[33, 32, 34],
        memory=[
            pb.ContainerMemory(memory_type="memory", size=1 << 30, topology=node),
            pb.ContainerMemory(memory_type="hugepages-1Gi", size=1 << 30, topology=node),
        ],
    )
    plain = pb.ContainerResources(name="sidecar", cpu_ids=[])
    pod = pb.PodResources(name="p", namespace="ml", containers=[container, plain])
    data = pb.ListPodResourcesResponse(pod_resources=[pod]).SerializeToString()
    _, _, cpus = read_pods(data)
    assert cpus == [ContainerCpus("ml", "p", "trainer", (32, 33, 34), (1,))], (
        "the sidecar lists neither: no entry, so its alignment is absent"
    )


def test_the_simulated_kubelet_writes_cpu_assignments_that_read_back() -> None:
    devices = [ContainerDevices("ml", "p", "trainer", "nvidia.com/gpu", ("GPU-a",))]
    cpus = [ContainerCpus("ml", "p", "trainer", (0, 1, 2), (0,))]
    written = list_response(devices, (), cpus=cpus).SerializeToString()
    assert read_pods(written) == (devices, [], cpus)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x0a\x05ab", id="a field longer than the message"),
        pytest.param(b"\x0a", id="a key without its length"),
        pytest.param(b"\x08\xff", id="a truncated varint"),
        pytest.param(b"\x0b", id="a group (wire type 3)"),
        pytest.param(b"\x0a\x04\x0a\x02\xff\xfe", id="a pod name that is not UTF-8"),
    ],
)
def test_malformed_bytes_are_a_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError):
        read_list(data)
