"""Kubernetes allocation against GPU activity (kubelet pod-resources, cgroups, idle accounting).

``subsystem.AllocationSubsystem`` is the part the app wires; ``metrics.py`` holds its families.
This ``__init__`` imports nothing, so importing a submodule (``metrics``) does not load the
pod-resources client (h2 and the subsystem, ~2.5 MiB RSS, not paid with ``--no-allocation``).
"""
