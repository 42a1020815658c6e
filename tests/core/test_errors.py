"""NVML errors are classified by code into the kinds the exporter acts on, with stable names."""

from __future__ import annotations

import pynvml
import pytest

from gpu_exporter.nvml.errors import (
    error_name,
    is_lost,
    is_not_found,
    is_not_supported,
    is_unavailable,
)


@pytest.mark.parametrize(
    ("error", "name"),
    [
        (pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), "gpu_is_lost"),
        (pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED), "not_supported"),
        (pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN), "unknown"),
        (pynvml.NVMLLibraryMismatchError("nvmlDeviceGetX_v9"), "nvml_library_mismatch_error"),
        (TimeoutError(), "timeout_error"),
    ],
)
def test_error_labels_are_snake_case_with_acronyms_kept_whole(error: Exception, name: str) -> None:
    assert error_name(error) == name


def test_kinds_follow_nvml_return_codes() -> None:
    assert is_not_supported(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))
    assert is_not_supported(pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND))
    assert is_lost(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    assert is_lost(pynvml.NVMLError(pynvml.NVML_ERROR_RESET_REQUIRED))
    assert is_not_found(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND))
    assert is_unavailable(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert is_unavailable(pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    unknown = pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
    assert not is_not_supported(unknown)
    assert not is_lost(unknown)
    assert not is_not_found(unknown)


def test_a_missing_versioned_symbol_means_the_driver_lacks_the_function() -> None:
    # pynvml raises this plain Exception (not an NVMLError) when the library lacks a _vN symbol.
    assert is_not_supported(pynvml.NVMLLibraryMismatchError("nvmlDeviceGetX_v9"))
