"""The SGLang worker: ``python -m dynamo_worker.sglang`` serves an in-process ``sglang.Engine``.

The only package of ``dynamo_worker`` that imports ``sglang``, and only lazily (inside functions), so
everything else (and this package's ``--help``, its tests and its compatibility check) works without
SGLang, torch or a GPU. Modules: ``args`` (command line -> ``WorkerPlan``), ``handler`` (one request:
``GenerateRequest`` -> ``async_generate`` -> ``GenerateChunk``), ``engine`` (``SglangEngine``, the
runtime's ``Engine``), ``kv_events`` (SGLang's ZMQ KV events -> event plane), ``uses`` (what we use
of SGLang, in one place) and ``compat`` (checks that against a pinned SGLang's source).
"""
