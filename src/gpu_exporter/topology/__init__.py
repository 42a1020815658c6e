"""Where GPUs sit: the paths between them (NVLink, PCIe, NUMA), read through NVML once per
allocation change (``read.py``), and what a pod's placement made of them (``paths.py``, pure)."""
