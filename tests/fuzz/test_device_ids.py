"""Properties of pod-resources device ids: any string parses to a reference or to "not a GPU", and
every form in docs/allocation.md, built from random UUIDs and indices, names the right device."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from gpu_exporter.allocation.ids import DeviceRef, parse_device_id, resolve, schedulable
from gpu_exporter.devices import DeviceId


@st.composite
def inventories(draw: st.DrawFn) -> tuple[DeviceId, ...]:
    """A node: GPUs 0..n-1 with random UUIDs; some in MIG mode with a few instances."""
    devices: list[DeviceId] = []
    for index in range(draw(st.integers(1, 8))):
        uuid = f"GPU-{draw(st.uuids())}"
        if not draw(st.booleans()):
            devices.append(DeviceId(index, uuid))
            continue
        devices.append(DeviceId(index, uuid, mig_mode="enabled"))
        for gpu_instance in draw(st.sets(st.integers(1, 14), min_size=1, max_size=7)):
            devices.append(
                DeviceId(
                    index,
                    f"MIG-{draw(st.uuids())}",
                    mig_mode="enabled",
                    parent_uuid=uuid,
                    gpu_instance_id=gpu_instance,
                    compute_instance_id=0,
                )
            )
    return tuple(devices)


def documented_ids(device: DeviceId, replica: int) -> list[tuple[str, int | None]]:
    """Every id a plugin may report for ``device`` (docs/allocation.md), with its replica."""
    if device.is_mig:
        uuid_forms = [
            device.uuid,
            f"MIG-{device.parent_uuid}/{device.gpu_instance_id}/{device.compute_instance_id}",
        ]
        gke = f"nvidia{device.index}/gi{device.gpu_instance_id}"
    else:
        uuid_forms = [device.uuid]
        gke = f"nvidia{device.index}"
    return [
        *((form, None) for form in uuid_forms),
        *((f"{form}::{replica}", replica) for form in uuid_forms),
        (gke, None),
        (f"{gke}/vgpu{replica}", replica),
    ]


@given(st.data(), inventories(), st.integers(0, 10**6))
def test_every_documented_form_names_its_device(
    data: st.DataObject, inventory: tuple[DeviceId, ...], replica: int
) -> None:
    device = data.draw(st.sampled_from(schedulable(inventory)))
    for raw, expected_replica in documented_ids(device, replica):
        spelled = data.draw(st.sampled_from(["", " ", "\t"])) + raw
        ref = parse_device_id(spelled)
        assert ref is not None, f"{spelled!r} not recognised"
        assert ref.replica == expected_replica, f"{spelled!r}: replica {ref.replica}"
        assert resolve(ref, inventory) == device, f"{spelled!r} names another device"


@given(st.text(max_size=60), inventories())
@example("GPU-a::" + "1" * 5000, (DeviceId(0, "GPU-a"),))  # more digits than int() takes
@example("nvidia" + "1" * 5000, (DeviceId(0, "GPU-a"),))
@example("nvidia\u0661", (DeviceId(1, "GPU-a"),))  # an Arabic-Indic 1: no plugin writes that
def test_any_string_is_a_reference_or_not_a_gpu(raw: str, inventory: tuple[DeviceId, ...]) -> None:
    assert_reference_or_not_a_gpu(raw, inventory)


_FRAGMENTS = ["GPU-", "MIG-", "MIG-GPU-", "nvidia", "/gi", "/vgpu", "::", "/", "-", "0", "7",
              "1" * 12, "ab", "ff-", " ", "²", "\u0661"]  # fmt: skip


@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=10).map("".join), inventories())
def test_near_misses_are_a_reference_or_not_a_gpu(
    raw: str, inventory: tuple[DeviceId, ...]
) -> None:
    assert_reference_or_not_a_gpu(raw, inventory)


def assert_reference_or_not_a_gpu(raw: str, inventory: tuple[DeviceId, ...]) -> None:
    ref = parse_device_id(raw)
    if ref is None:
        return
    assert isinstance(ref, DeviceRef)
    assert ref.raw == raw
    assert (ref.uuid is None) != (ref.index is None), f"{raw!r}: a UUID or an index, not both"
    assert ref.raw.strip().isascii(), f"{raw!r}: plugins write ASCII ids"
    found = resolve(ref, inventory)
    assert found is None or found in inventory
