"""``dynamo-run MANIFEST``: serve a DynamoGraphDeployment on this machine (see ``--help``)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from dynamo_worker.local.run import EXIT_INVALID, run
from dynamo_worker.local.settings import parse_args
from dynamo_worker.local.supervisor import Console, ConsoleLogHandler
from dynamo_worker.runtime.settings import SettingsError


def main(argv: Sequence[str] | None = None) -> int:
    console = Console()
    handler = ConsoleLogHandler(console)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        manifest, settings = parse_args(argv)
    except SettingsError as e:
        logging.getLogger(__name__).error("%s", e)
        return EXIT_INVALID
    return run(manifest, settings, console)


if __name__ == "__main__":
    sys.exit(main())
