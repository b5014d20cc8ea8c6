"""``python -m poslab``: the command line; also torchrun's module entry (``torchrun ... -m poslab train``)."""

import sys

from poslab.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
