import sys

from agent_runtime.host import main

sys.exit(main())
