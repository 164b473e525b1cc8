"""`python -m kinfolk ...` is the `kinfolk` console script (handy under `accelerate launch -m kinfolk`)."""

import sys

from kinfolk.commands import main

sys.exit(main())
