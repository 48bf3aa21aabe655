"""Prometheus metrics of the workers (``chongming-redis worker --metrics-port``).

``worker``: ``WorkerMetrics``, the runtime's ``WorkerEvents`` as Prometheus series, and the
``/metrics`` endpoint. ``shared``: the directory through which the children of a
``--processes N`` parent share their series (prometheus-client's multiprocess mode).

Importing this package imports nothing else: ``shared`` must set its environment variable
before anything imports ``prometheus_client``. ``worker`` needs the ``[metrics]`` extra
(prometheus-client): without it, importing it raises ``MissingExtra`` naming it.
"""
