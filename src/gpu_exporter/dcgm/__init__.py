"""DCGM: a ctypes binding of the calls the activity source needs, and that source's engine side.

``library`` is the binding (one swappable library object, as pynvml has for libnvidia-ml);
``structs`` its constants and C layouts, each cited to DCGM's headers; ``session`` what one
connection to a host engine watches and reads; ``service`` the event-loop side that keeps a
session up (connect, reconnect with backoff, bounded calls on worker threads). ``readings``
(what the collectors read) and ``target`` (the parsed ``--dcgm.address``) are leaves that the
core imports without the binding.

This package imports nothing: the binding and the service are loaded only when a DCGM source is
built (``--dcgm.address``/``--dcgm.embedded``; docs/performance.md, Peak RSS).
"""
