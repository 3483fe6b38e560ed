"""``python -m dynamo_worker.epp``: the Gateway API endpoint picker (``--help`` for its flags)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dynamo_worker.epp.app import run_epp
from dynamo_worker.epp.settings import EppSettings
from dynamo_worker.runtime import aio
from dynamo_worker.runtime.settings import SettingsError, configure_logging


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = EppSettings.parse(argv)
    except SettingsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    configure_logging()
    return aio.run(run_epp(settings))


if __name__ == "__main__":
    sys.exit(main())
