"""Envoy ext_proc messages of the endpoint picker protocol (GAIE's EPP), in and out. Pure.

In: the request headers (``request_headers``), the body in chunks of at most 64 KB
(``request_body``, the last with ``end_of_stream``), maybe trailers. Out, once the body is whole: a
``HeadersResponse`` that sets the destination header ``x-gateway-destination-endpoint`` (and the chosen
workers' headers), removes the routing headers a client sent, and clears the route cache; the same
destination in the dynamic metadata ``envoy.lb`` / ``x-gateway-destination-endpoint``; then, because the
body was streamed to us in full-duplex mode, the body itself (``BodyResponse`` with a streamed body
mutation, ending the stream); and a ``TrailersResponse`` for trailers. Or an ``ImmediateResponse``: an
OpenAI-shaped error with its status (and ``Retry-After`` where waiting helps).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

__all__ = [
    "DESTINATION_HEADER",
    "LB_NAMESPACE",
    "OBJECTIVE_HEADER",
    "body_responses",
    "header_map",
    "headers_response",
    "immediate_response",
    "response_headers_response",
    "response_trailers_response",
    "trailers_response",
]

DESTINATION_HEADER = "x-gateway-destination-endpoint"  # ip:port of the chosen endpoint (GAIE)
LB_NAMESPACE = "envoy.lb"  # the dynamic metadata namespace the gateway's load balancer reads (GAIE)
OBJECTIVE_HEADER = "x-gateway-inference-objective"  # the request's InferenceObjective: its priority
BODY_CHUNK = 62 * 1024  # a streamed body mutation's chunk: under Envoy's 64 KB per message


def header_map(headers: base_pb2.HeaderMap) -> dict[str, str]:
    """Lower-cased names to values (Envoy sends ``raw_value`` bytes, older ones ``value``)."""
    out: dict[str, str] = {}
    for h in headers.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        out[h.key.lower()] = value
    return out


def _set(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def headers_response(
    destination: str | None, set_headers: Mapping[str, str], remove: Iterable[str]
) -> pb.ProcessingResponse:
    """The answer to the request headers: ``set_headers`` (with the destination, when there is one)
    set, ``remove`` removed, the route cache cleared, and the destination in ``envoy.lb`` metadata."""
    headers = dict(set_headers)
    if destination is not None:
        headers[DESTINATION_HEADER] = destination
    mutation = pb.HeaderMutation(
        set_headers=[_set(k, v) for k, v in headers.items()],
        remove_headers=[h for h in remove if h not in headers],
    )
    response = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=mutation, clear_route_cache=True)
        )
    )
    if destination is not None:
        response.dynamic_metadata.CopyFrom(_lb_metadata(destination))
    return response


@functools.lru_cache(maxsize=256)
def _lb_metadata(destination: str) -> struct_pb2.Struct:
    """``envoy.lb`` / ``x-gateway-destination-endpoint``: built once per frontend replica (a Struct built
    from a dict costs more than copying one). The caller copies it, never changes it."""
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION_HEADER: destination}})
    return metadata


def body_responses(body: bytes) -> list[pb.ProcessingResponse]:
    """The body back to Envoy, in chunks under 64 KB, the last ending the stream (full-duplex mode: Envoy
    holds none of what it streamed to us)."""
    chunks = [body[i : i + BODY_CHUNK] for i in range(0, len(body), BODY_CHUNK)] or [b""]
    return [
        pb.ProcessingResponse(
            request_body=pb.BodyResponse(
                response=pb.CommonResponse(
                    body_mutation=pb.BodyMutation(
                        streamed_response=pb.StreamedBodyResponse(
                            body=chunk, end_of_stream=i == len(chunks) - 1
                        )
                    )
                )
            )
        )
        for i, chunk in enumerate(chunks)
    ]


def trailers_response() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())


def response_headers_response() -> pb.ProcessingResponse:
    """The response headers passed on unchanged."""
    return pb.ProcessingResponse(response_headers=pb.HeadersResponse())


def response_trailers_response() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def immediate_response(
    status: int, body: Mapping[str, Any], headers: Mapping[str, str]
) -> pb.ProcessingResponse:
    """An answer Envoy sends the client in place of the upstream's: JSON ``body`` with ``status``."""
    all_headers = {"content-type": "application/json", **headers}
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=pb.HeaderMutation(set_headers=[_set(k, v) for k, v in all_headers.items()]),
            body=json.dumps(body).encode(),
            details=f"dynamo_epp_{status}",
        )
    )
