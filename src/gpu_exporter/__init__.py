"""gpu-exporter: a node agent that tells GPU fleet operators what their GPUs really do."""

__version__ = "0.1.0"
