"""A simulated GPU fleet with Prometheus and Alertmanager running the operations kit.

``python -m demo`` (``make demo``) starts it; :mod:`demo.stack` is also what the end-to-end test
(``tests/ops/test_e2e.py``) runs, so the demo and the test cannot drift apart.
"""
