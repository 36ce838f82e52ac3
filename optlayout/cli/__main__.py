"""`python -m optlayout.cli`."""

from optlayout.cli import main

main()
