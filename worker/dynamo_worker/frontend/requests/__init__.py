"""Request shaping, per endpoint: an OpenAI body parsed and checked against what its model serves, and
turned into a ``Job`` the workers can run (token ids, sampling, stop conditions, the features it uses).
Nothing here talks to a language worker."""
