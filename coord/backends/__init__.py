"""Backends: one module per coordination store, each implementing :mod:`coord.abc`.

Imported lazily by :func:`coord.connect`; ``coord`` itself never imports them.
"""
