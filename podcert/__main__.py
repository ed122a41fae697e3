import sys

from podcert.cli import main

sys.exit(main())
