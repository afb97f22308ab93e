import sys

from pgscope.cli import main

sys.exit(main())
