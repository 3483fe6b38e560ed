"""The HTTP surface: the OpenAI routes and what every request goes through there (the frontend's bound
on requests in flight, reading the body, admission, counting), and the informational endpoints
(``/v1/models``, ``/health``, ``/live``, ``/metrics``)."""
