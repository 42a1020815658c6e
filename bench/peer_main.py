"""nvitop-exporter's own entry point with the simulator's CPU metered as in ``exporter_main.py``.

Run under ``gpu-exporter-simulate SCENARIO -- python bench/peer_main.py <nvitop-exporter flags>``:
the start-up hook puts the simulated node under nvitop's pynvml; this wraps the node's library with
the same :class:`simmeter.SimMeter` before nvitop-exporter's first ``nvmlInit`` installs it, and
answers SIGUSR1 the same way. nvitop-exporter itself runs unmodified.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simmeter import install_dump, metered_install

import gpu_exporter.simulator as simulator  # the hook imports it at the first nvmlInit anyway

if __name__ == "__main__":
    simulator.install = metered_install(simulator.install)
    install_dump()
    from nvitop_exporter.cli import main

    sys.exit(main())
