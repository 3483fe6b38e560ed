"""``python -m dynamo.planner ARGS``: execs our counterpart with ARGS (``dynamo_worker.aliases``)."""

import sys

from dynamo_worker.aliases import main

sys.exit(main("dynamo.planner"))
