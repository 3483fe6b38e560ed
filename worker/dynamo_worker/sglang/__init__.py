"""The SGLang worker: ``python -m dynamo_worker.sglang`` serves an in-process ``sglang.Engine``.

The only package of ``dynamo_worker`` that imports ``sglang``, and only lazily (inside functions), so
everything else (and this package's ``--help``, its tests and its compatibility check) works without
SGLang, torch or a GPU. Modules: ``args`` (command line -> ``WorkerPlan``), ``handler`` (one request:
``GenerateRequest`` -> ``async_generate`` -> ``GenerateChunk``), ``engine`` (``SglangEngine``, the
runtime's ``Engine``), ``resolved`` (the resolved ``ServerArgs`` values read after start),
``kv_events`` (SGLang's ZMQ KV events -> event plane), ``uses`` (what we use of SGLang, and the
window of SGLang releases we support, in one place), ``source`` (SGLang's source read without
importing it) and ``compat`` (checks our use against a release's source).
"""
