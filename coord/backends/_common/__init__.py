"""What every backend shares: the lease's keepalive and local deadline
(``keepalive.py``), the first contact with a store (``probe.py``), and the stores' size
limits (``limits.py``), a server's metrics (``metrics.py``)."""
