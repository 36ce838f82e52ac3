"""`python -m optlayout.cli`."""

from optlayout.cli import run

run()
