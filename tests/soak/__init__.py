"""The soak (``make soak``; out of CI, but a 2-minute run of the same code is in the suite:
tests/e2e/test_soak.py): the disaggregated soak graph (2 prefill + 2 decode + 1 embedding worker on the
mocker) under ``dynamo-run --restart always``, steady mixed traffic, a fault every 30-60 s, one table. See
docs/soak.md."""
