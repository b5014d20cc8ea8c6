import sys

from poslab.cli import main

sys.exit(main())
