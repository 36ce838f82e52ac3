"""`python -m optlayout`."""

from optlayout.cli import run

run()
