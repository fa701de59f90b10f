import sys

from cute_kernels.cli import main

sys.exit(main())
