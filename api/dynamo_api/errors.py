"""DynamoError: the root of every exception that dynamo_api, dynamo_operator and dynamo_worker define,
so ``except DynamoError`` catches what we raise and nothing else. A class keeps its standard-library
base where callers catch that (a ``ManifestError`` is a ``ValueError`` too). A module is named where
it differs from the parent's. The tree (docs/errors.md says what each branch is for)::

    DynamoError
    ├── ConversionError (ValueError)     dynamo_api.conversion
    ├── KubeError                        dynamo_api.kube_errors
    │   ├── NotFound
    │   ├── Conflict
    │   ├── Invalid
    │   └── GraphFileError               dynamo_worker.planner.localgraph
    ├── LoraClientError                  dynamo_clients.lora_client
    │   ├── SystemPortUnreachable
    │   └── LoraRefused
    ├── SettingsError (ValueError)       dynamo_api.settings_sources
    ├── CertError (ValueError)           dynamo_operator.certs
    ├── AliasError (ValueError)          dynamo_worker.aliases
    ├── QueueFull                        dynamo_worker.epp.flow
    ├── QueueTimeout                     dynamo_worker.epp.flow
    ├── ApiError                         dynamo_worker.frontend.errors
    │   ├── InvalidRequest
    │   │   └── RequestTimeout
    │   ├── ModelNotFound
    │   ├── AdapterNotFound
    │   ├── TooManyRequests
    │   ├── Unauthorized                 dynamo_worker.frontend.http.auth
    │   ├── ServiceUnavailable
    │   └── UpstreamError
    │       ├── UpstreamTimeout
    │       └── WorkerLost
    ├── TemplateError                    dynamo_worker.frontend.models.registry
    ├── _PrivateAddress (OSError)        dynamo_worker.frontend.requests.chat_images
    ├── Unreachable                      dynamo_worker.frontend.requests.chat_images
    ├── _Retryable                       dynamo_worker.frontend.serving.dispatch
    ├── ManifestError (ValueError)       dynamo_worker.local.manifest
    ├── PlanError                        dynamo_worker.local.plan
    ├── SupervisorError (RuntimeError)   dynamo_worker.local.supervisor
    │   ├── ProcessDied
    │   └── StartupTimeout
    ├── BootstrapTimeout                 dynamo_worker.mocker.bootstrap
    ├── BootstrapRefused                 dynamo_worker.mocker.bootstrap
    ├── CacheFullError (RuntimeError)    dynamo_worker.mocker.kv_manager
    ├── BadRequest (ValueError)          dynamo_worker.mocker.sglang_http
    ├── BadImage (ValueError)            dynamo_worker.multimodal.images
    ├── ServiceError                     dynamo_worker.multimodal.service
    ├── BudgetError (ValueError)         dynamo_worker.planner.decide
    ├── ScrapeError (RuntimeError)       dynamo_worker.planner.observe
    ├── GraphError (ValueError)          dynamo_worker.planner.step
    ├── ProfileError (ValueError)        dynamo_worker.profile.model
    ├── SweepError (RuntimeError)        dynamo_worker.profile.sweep
    ├── DiscoveryError (RuntimeError)    dynamo_worker.runtime.discovery
    ├── PortUnavailable (OSError)        dynamo_worker.runtime.listening
    ├── LoraError                        dynamo_worker.runtime.lora_checks
    ├── ModelCardError (RuntimeError)    dynamo_worker.runtime.modelcard
    ├── NatsServerError (RuntimeError)   dynamo_worker.runtime.nats_server
    ├── RequestPlaneError                dynamo_worker.runtime.request_plane
    │   ├── WorkerUnreachable
    │   ├── WorkerRejected
    │   ├── WorkerTimeout
    │   └── WorkerStreamBroken
    ├── WorkerStartError (RuntimeError)  dynamo_worker.runtime.worker
    ├── WorkerArgsError (ValueError)     dynamo_worker.sglang.args
    ├── CompatError (RuntimeError)       dynamo_worker.sglang.compat
    ├── EngineStartError (RuntimeError)  dynamo_worker.sglang.engine
    ├── KvEventDecodeError (ValueError)  dynamo_worker.sglang.kv_events
    └── LayoutError (ValueError)         dynamo_worker.sglang.source

A test (tests/unit/api/test_errors.py) fails when a class is defined outside this tree or missing here.
"""

from __future__ import annotations

__all__ = ["DynamoError"]


class DynamoError(Exception):
    """The root of every exception of ours; it adds nothing to ``Exception``."""
