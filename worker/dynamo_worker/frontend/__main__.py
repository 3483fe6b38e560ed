"""``python -m dynamo_worker.frontend``: the OpenAI-compatible frontend (``--help`` for its flags)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from dynamo_worker.frontend.app import run_frontend
from dynamo_worker.frontend.settings import FrontendSettings
from dynamo_worker.runtime import aio
from dynamo_worker.runtime.settings import SettingsError, configure_logging

log = logging.getLogger("dynamo_worker.frontend")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings, unknown = FrontendSettings.parse_known(argv)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    configure_logging()
    if unknown:
        log.warning("Ignored arguments this frontend does not use args=%s", " ".join(unknown))
    return aio.run(run_frontend(settings, argv=sys.argv[1:] if argv is None else list(argv)))


if __name__ == "__main__":
    sys.exit(main())
