"""The Gateway API Inference Extension endpoint picker (``python -m dynamo_worker.epp``): Envoy ext_proc,
deciding with the frontend's router for every frontend replica at once (docs/gateway-api.md)."""
