"""``python -m mooncake_connectors.lmdeploy ...``: see ``launcher``."""

import sys

from mooncake_connectors.lmdeploy.launcher import main

if __name__ == "__main__":
    sys.exit(main())
