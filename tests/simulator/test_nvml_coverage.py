"""Every function pynvml wraps answers on the simulator as on a Hopper-era driver: a value, zero,
an empty list or NotSupported, never FunctionNotFound; the NotSupported ones say why in a table."""

from __future__ import annotations

import ctypes
import inspect
import re
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpu_exporter.simulator import SimulatedNode
from gpu_exporter.simulator.coverage import constants_table, not_supported_table
from gpu_exporter.simulator.library import C_FUNCTIONS, METHODS

from .sim_helpers import FakeClock, MakeNode

NODE = """
gpus:
  - model: H100-SXM-80GB
  - model: H100-SXM-80GB
    mig: [3g.40gb, 1g.10gb]
workloads:
  - {gpu: 0, pod: train, pid: 1234, memory: 10GiB, sm: 0.5, dram: 0.4}
  - {gpu: 0, pod: mps-client, pid: 1235, memory: 1GiB, sm: 0.2, mps: true}
  - {gpu: 1, mig: 0, pod: small, pid: 2345, memory: 8GiB, sm: 0.8}
"""


def pynvml_wrappers() -> dict[str, list[Callable[..., Any]]]:
    """C function -> the pynvml Python functions that call it (read from pynvml's source)."""
    source = Path(pynvml.__file__).read_text()
    wrappers: dict[str, list[Callable[..., Any]]] = {}
    for chunk in re.split(r"\n(?=def |@)", source):
        name = re.search(r"^def (\w+)\(", chunk, re.M)
        if name is None or not hasattr(pynvml, name.group(1)):
            continue
        for c_name in set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', chunk)):
            wrappers.setdefault(c_name, []).append(getattr(pynvml, name.group(1)))
    return wrappers


WRAPPERS = pynvml_wrappers()


def test_pynvml_wraps_nothing_the_simulator_lacks() -> None:
    missing = sorted(set(WRAPPERS) - C_FUNCTIONS)
    assert not missing, (
        f"nvidia-ml-py {version('nvidia-ml-py')} wraps C functions the simulator neither "
        f"implements nor lists in data/nvml_not_supported.tsv (FunctionNotFound): {missing}"
    )


def test_the_table_lists_only_what_is_not_implemented() -> None:
    stale = sorted(set(not_supported_table()) & (METHODS | set(constants_table())))
    assert not stale, f"implemented now: remove their rows from nvml_not_supported.tsv: {stale}"
    both = sorted(set(constants_table()) & METHODS)
    assert not both, f"implemented by a method: remove their rows from nvml_constants.tsv: {both}"
    assert all(row.reason for row in not_supported_table().values())


def test_every_function_resolves_through_pynvml(make_node: MakeNode) -> None:
    make_node(NODE)
    for c_name in sorted(WRAPPERS):
        try:
            pynvml._nvmlGetFunctionPointer(c_name)
        except pynvml.NVMLError_FunctionNotFound:
            pytest.fail(f"{c_name}: FunctionNotFound, which a real driver never answers")


class Arguments:
    """Plausible arguments for a pynvml wrapper, by parameter name (handles of the node)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        mig_gpu = pynvml.nvmlDeviceGetHandleByIndex(1)
        self.mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 0)
        self.gpu_instance = pynvml.nvmlDeviceGetGpuInstanceById(mig_gpu, 1)
        self.event_set = pynvml.nvmlEventSetCreate()
        self.uuid = pynvml.nvmlDeviceGetUUID(self.gpu)
        self.serial = pynvml.nvmlDeviceGetSerial(self.gpu)
        self.bus_id = pynvml.nvmlDeviceGetPciInfo(self.gpu).busId

    def build(self, function: Callable[..., Any]) -> list[Any]:
        return [self.value(p) for p in inspect.signature(function).parameters.values()]

    def value(self, parameter: inspect.Parameter) -> Any:
        name = parameter.name
        if name in ("handle", "device", "handle1", "device1"):
            return self.gpu
        if name in ("handle2", "device2"):
            return pynvml.nvmlDeviceGetHandleByIndex(1)
        if name == "migDevice":
            return self.mig
        if name == "gpuInstance":
            return self.gpu_instance
        if name == "eventSet":
            return self.event_set
        text = {"uuid": self.uuid, "serial": self.serial, "pciBusId": self.bus_id}
        if name in text:
            return text[name]
        if name == "fieldIds":
            return [pynvml.NVML_FI_DEV_MEMORY_TEMP]
        if name == "timeoutms":
            return 0
        if parameter.default is not inspect.Parameter.empty:
            return parameter.default
        return 0


# Wrappers whose arguments cannot be guessed from their names, and what to pass instead.
SPECIAL: dict[str, Callable[[Arguments], list[Any]]] = {
    "nvmlDeviceGetHandleByIndex": lambda a: [0],
    "nvmlDeviceGetMigDeviceHandleByIndex": lambda a: [pynvml.nvmlDeviceGetHandleByIndex(1), 0],
    "nvmlDeviceGetGpuInstanceById": lambda a: [pynvml.nvmlDeviceGetHandleByIndex(1), 1],
    "nvmlDeviceGetGpuInstanceProfileInfoById": lambda a: [pynvml.nvmlDeviceGetHandleByIndex(1), 0],
    "nvmlDeviceGetGpuInstanceProfileInfo": lambda a: [a.gpu, 0],
    "nvmlDeviceGetGpuInstanceProfileInfoV": lambda a: [a.gpu, 0],
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": lambda a: [a.mig],
    "nvmlDeviceGetGpuInstanceId": lambda a: [a.mig],
    "nvmlDeviceGetComputeInstanceId": lambda a: [a.mig],
    "nvmlDeviceGetTemperatureV": lambda a: [a.gpu, pynvml.NVML_TEMPERATURE_GPU],
    "nvmlDeviceGetClockInfo": lambda a: [a.gpu, pynvml.NVML_CLOCK_SM],
    "nvmlDeviceGetMaxClockInfo": lambda a: [a.gpu, pynvml.NVML_CLOCK_SM],
    "nvmlDeviceGetTotalEccErrors": lambda a: [a.gpu, 0, 0],
    "nvmlGpmMetricsGet": lambda a: [_gpm_metrics(a)],
    "nvmlGpmSampleGet": lambda a: [a.gpu, pynvml.nvmlGpmSampleAlloc()],
    "nvmlGpmMigSampleGet": lambda a: [
        pynvml.nvmlDeviceGetHandleByIndex(1),
        1,
        pynvml.nvmlGpmSampleAlloc(),
    ],
    "nvmlGpmSampleFree": lambda a: [pynvml.nvmlGpmSampleAlloc()],
    "nvmlEventSetFree": lambda a: [pynvml.nvmlEventSetCreate()],
    "nvmlEventSetWait": lambda a: [a.event_set, 0],
    "nvmlEventSetWait_v2": lambda a: [a.event_set, 0],
    "nvmlSystemGetProcessName": lambda a: [1234],
    "nvmlDeviceGetGpuFabricInfo": lambda a: [a.gpu, pynvml.byref(pynvml.c_nvmlGpuFabricInfo_t())],
    "nvmlDeviceGetGpuFabricInfoV": lambda a: [a.gpu, pynvml.byref(_fabric_v3())],
    # Affinity masks: room for 4 x 64 CPUs (or NUMA nodes); a size of 0 is an invalid argument.
    "nvmlDeviceGetCpuAffinity": lambda a: [a.gpu, 4],
    "nvmlDeviceGetCpuAffinityWithinScope": lambda a: [a.gpu, 4, 0],
    "nvmlDeviceGetMemoryAffinity": lambda a: [a.gpu, 4, 0],
}
# Answers besides a value and NotSupported that are what a real driver gives for these calls.
EXPECTED_ERRORS: dict[str, type[pynvml.NVMLError]] = {
    # Nothing happened on the event set the test just made: the wait times out.
    "nvmlEventSetWait": pynvml.NVMLError_Timeout,
    "nvmlEventSetWait_v2": pynvml.NVMLError_Timeout,
}


def _fabric_v3() -> Any:
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    info.version = pynvml.nvmlGpuFabricInfo_v3
    return info


def _gpm_metrics(arguments: Arguments) -> Any:
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(arguments.gpu, first)
    arguments.clock.advance(1)
    pynvml.nvmlGpmSampleGet(arguments.gpu, second)
    return _gpm_request(first, second)


def _gpm_request(first: Any, second: Any) -> Any:
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    return request


def wrapper_calls() -> Iterator[tuple[str, Callable[..., Any]]]:
    for c_name, functions in sorted(WRAPPERS.items()):
        for function in functions:
            yield c_name, function


@pytest.fixture
def api(make_node: MakeNode, clock: FakeClock) -> tuple[SimulatedNode, Arguments]:
    node = make_node(NODE)
    clock.advance(3)
    return node, Arguments(clock)


def test_every_wrapper_answers_a_value_or_not_supported(
    api: tuple[SimulatedNode, Arguments],
) -> None:
    _, arguments = api
    wrong: list[str] = []
    for c_name, function in wrapper_calls():
        special = SPECIAL.get(function.__name__)
        args = special(arguments) if special else arguments.build(function)
        try:
            function(*args)
        except pynvml.NVMLError_NotSupported:
            continue
        except pynvml.NVMLError as error:
            if not isinstance(error, EXPECTED_ERRORS.get(function.__name__, ())):
                wrong.append(f"{function.__name__} ({c_name}): {type(error).__name__}")
        except (TypeError, ValueError, AttributeError, ctypes.ArgumentError) as error:
            # Arguments the test cannot guess (structs the caller fills in): a function from the
            # table answers NotSupported whatever it is given, so ask the C function directly.
            if c_name not in not_supported_table():
                wrong.append(f"{function.__name__} ({c_name}): the test's arguments: {error!r}")
            elif pynvml._nvmlGetFunctionPointer(c_name)(arguments.gpu, None, None) != 3:
                wrong.append(f"{c_name}: listed as NotSupported, answers something else")
    assert not wrong, "answers neither a value nor NotSupported:\n" + "\n".join(wrong)
