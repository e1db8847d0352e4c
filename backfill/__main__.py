"""``python -m backfill MODULE:ATTR --bootstrap-servers B --application-id A --state-dir D ...``:
the ``processor backfill`` command, runnable by ``spark-submit`` (which then owns the session)."""

import sys

from processor.cli import main

if __name__ == "__main__":
    sys.exit(main(["backfill", *sys.argv[1:]]))
