"""The I/O half of the operator: kopf handlers, the Kubernetes client, the reconcile loop.

Pure deciding helpers (``apply_rules``, ``status``, ``conditions``, ``outcome``, ``scaling``, ``groups``,
``pair_gate``, ``workqueue``, ``loop``) are kept apart from the modules that do I/O (``kube``: the only
door to the API client, ``dynamo_clients.kube``; ``controller``: the visit; ``scaling_adapters``: scaling
adapters; ``restarts``: multinode group restarts; ``handlers``: every kopf decorator).
"""
