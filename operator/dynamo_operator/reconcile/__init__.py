"""The I/O half of the operator: kopf handlers, the Kubernetes client, the reconcile loop.

Pure deciding helpers (``plan``, ``status``, ``conditions``, ``outcome``, ``scaling``, ``groups``,
``pairing``, ``workqueue``) are kept apart from the modules that do I/O (``kube``: the only one that
talks to the API; ``controller``: the visit; ``adapters``: scaling adapters; ``restarts``: multinode
group restarts; ``handlers``: every kopf decorator).
"""
