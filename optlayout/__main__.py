"""`python -m optlayout`."""

from optlayout.cli import main

main()
