import sys

from moeconf.cli import main

sys.exit(main())
