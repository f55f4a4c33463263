"""``python -m etj_testbed.localcluster.proclet``: the harness as its own process (start_subprocess)."""

import sys

from etj_testbed.localcluster.proclet.launch import main

sys.exit(main())
