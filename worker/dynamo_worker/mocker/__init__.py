"""The mocker: a simulated SGLang engine (timing model, KV blocks with prefix caching and KV events,
prefill/decode rendezvous) served by the same runtime as the real worker; with ``--is-embedding`` an
embedding worker, and with ``--script`` scripted replies (``scripted``).

Run it with ``python -m dynamo_worker.mocker``."""
